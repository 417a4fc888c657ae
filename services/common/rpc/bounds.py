"""Bounds on what a request may carry, and how an error message shows a value a client sent.

Every string and repeated field of an `rft.v1` request has a bound (the `.proto` comments state each
one): `DecodeErrorInterceptor` checks each request message it decodes with `message_problem`, for every
service, and a request over a bound is refused with INVALID_ARGUMENT naming the field. The buffer core
checks its own fields again (`services.buffer.core.check_text`), for requests that never pass a server. An error message shows a client's
value through `shown`, at most `SHOWN_CHARS` characters plus its length, so a refusal never outgrows
the client's message limit (a 10 KB id echoed back would reach the client as RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

# Ids and names a client makes up: consumer, producer_id, member_id, lease ids.
MAX_ID_CHARS = 128
# Entries of a repeated id field (e.g. the lease ids of OpenConsumer).
MAX_ID_LIST = 65536
# Characters of a client's value an error message shows.
SHOWN_CHARS = 64
# Bounds by field name of the strings of `rft.v1` requests that are not ids (any other string is at most
# MAX_ID_CHARS), and of their lists (any other list at most MAX_ID_LIST entries); see `message_problem`.
TEXT_LIMITS = {
    "consumer_group": 64,
    "address": 256,
    "master_address": 256,
    "message": 4096,
    "checkpoint_path": 4096,
    "name": 1024,
    "session_id": 1024,
    "response_id": 1024,
    "session_ids": 1024,
}
LIST_LIMITS = {"tensors": 1 << 20, "shape": 16}


def shown(value: str, keep: int = SHOWN_CHARS) -> str:
    """`value` as an error message shows it: quoted, cut to `keep` characters with its length after it."""
    if len(value) <= keep:
        return repr(value)
    return f"{value[:keep]!r}... ({len(value)} characters)"


def text_problem(value: str, limit: int = MAX_ID_CHARS) -> str | None:
    """Why `value` is over `limit` characters, or None when it fits."""
    if len(value) > limit:
        return f"{len(value)} characters, over the limit of {limit} (starts {value[:SHOWN_CHARS]!r})"
    return None


def list_problem(
    values: Sequence[str], limit: int = MAX_ID_LIST, item_limit: int = MAX_ID_CHARS
) -> tuple[str, str] | None:
    """(`[i]` or "", why) for the first bound `values` breaks (more than `limit` entries, or an entry over
    `item_limit` characters), or None when every bound holds."""
    if len(values) > limit:
        return "", f"{len(values)} entries, over the limit of {limit}"
    for i, value in enumerate(values):
        problem = text_problem(value, item_limit)
        if problem:
            return f"[{i}]", problem
    return None


def message_problem(
    message: Message,
    text_limits: Mapping[str, int] | None = None,
    list_limits: Mapping[str, int] | None = None,
    prefix: str = "",
) -> tuple[str, str] | None:
    """(field path, why) for the first string or repeated field of `message` (nested messages included)
    over its bound, or None. A string's bound is `text_limits[field name]` (default `TEXT_LIMITS`), else
    `MAX_ID_CHARS`; a repeated field's `list_limits[field name]` (default `LIST_LIMITS`), else
    `MAX_ID_LIST`. Paths read like `member.member_id` and `tensors[3].name`. Bytes are not checked (the
    message size limit bounds them)."""
    text_limits = TEXT_LIMITS if text_limits is None else text_limits
    list_limits = LIST_LIMITS if list_limits is None else list_limits
    for field, value in message.ListFields():
        path = prefix + field.name
        if field.is_repeated:
            limit = list_limits.get(field.name, MAX_ID_LIST)
            if len(value) > limit:
                return path, f"{len(value)} entries, over the limit of {limit}"
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                continue  # a map: its size is bounded; its entries are not ids
            for i, item in enumerate(value):
                found = _value_problem(field, item, f"{path}[{i}]", text_limits, list_limits)
                if found:
                    return found
        else:
            found = _value_problem(field, value, path, text_limits, list_limits)
            if found:
                return found
    return None


def _value_problem(
    field: FieldDescriptor,
    value: object,
    path: str,
    text_limits: Mapping[str, int],
    list_limits: Mapping[str, int],
) -> tuple[str, str] | None:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return message_problem(value, text_limits, list_limits, path + ".")  # type: ignore[arg-type]
    if field.type == FieldDescriptor.TYPE_STRING:
        problem = text_problem(value, text_limits.get(field.name, MAX_ID_CHARS))  # type: ignore[arg-type]
        return (path, problem) if problem else None
    return None
