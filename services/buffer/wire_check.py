"""Fast path of batch validation on the experiences' wire bytes, as received: one scan per experience and
two numpy reductions per batch, without reading a single array through the parsed message.

`validation.validate_batch` calls `batch_ok` first. It answers True only when it is sure the batch passes
every check of `validation` (see its docstring); anything it does not expect (an unknown field, a
repeated field sent unpacked or in several pieces, a wrong wire type, a token id of 2^28 or more, a
varint that does not fit its field) makes it answer False, and the checks on the parsed message then
decide and name the field. The bytes were already parsed once (`WireBatch.parse`), so they are
well-formed protobuf here.

Lengths come from the bytes: a packed varint array (tokens, action_mask) holds as many values as bytes
below 0x80 (each value's last byte), a packed float array 4 bytes per value. Token ids of the whole batch
are decoded at once (varint: 7 bits per byte, little-endian groups, https://protobuf.dev/programming-guides/encoding/).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

import numpy as np

from services.common.protowire import read_varint

# rft.v1.Experience field numbers (protos/rft/v1/experience.proto).
TOKENS, PROMPT_LENGTH, MODEL_VERSION, USE_COUNT = 2, 3, 9, 17
REJECTED_TOKENS, REJECTED_PROMPT_LENGTH = 18, 19
REWARD, REWARD_BASELINE = 6, 20
DOUBLES = frozenset((REWARD, REWARD_BASELINE))
FLOAT_ARRAYS = frozenset((4, 7, 14, 15, 16))  # logprobs, token_level_rewards, advantages, returns, teacher
ACTION_MASK = 5
TOKEN_MODEL_VERSIONS = 21  # packed int64: checked for length, and >= 0 by being short (see _scan)
SKIPPED_BYTES = frozenset((1, 10, 11, 12, 13))  # eid, metrics, info, prompt_text, response_text
# truncated, and the int scalars checked >= 0 (also the two prompt lengths, kept for the length checks)
VARINTS = frozenset((8, PROMPT_LENGTH, MODEL_VERSION, USE_COUNT, REJECTED_PROMPT_LENGTH))
ONCE = FLOAT_ARRAYS | {TOKENS, ACTION_MASK, REJECTED_TOKENS, TOKEN_MODEL_VERSIONS}

_CONTINUATION = bytes(range(0x80, 0x100))
_DOUBLE = struct.Struct("<d")
MAX_ID_BYTES = 4  # ids below 2^28 take at most 4 varint bytes; longer ones go to the slow path


def _count(packed: bytes) -> int:
    """Values in a packed varint array: its bytes below 0x80."""
    return len(packed.translate(None, _CONTINUATION))


def _scan(data: bytes, token_parts: list[bytes], float_parts: list[bytes]) -> bool:
    """Check one experience's scalars and lengths; queue its token and float arrays. False: not sure."""
    seen = 0  # bit per field number of ONCE met so far
    prompt_length = rejected_prompt_length = 0
    tokens = rejected = b""
    lengths: list[int] = []
    i, end = 0, len(data)
    while i < end:
        key = data[i]
        i += 1
        if key >= 0x80:
            key, i = read_varint(data, i - 1)
        number = key >> 3
        wire_type = key & 7
        if wire_type == 2:
            length = data[i]
            i += 1
            if length >= 0x80:  # arrays of a usual size: two bytes, read inline
                high = data[i]
                if high < 0x80:
                    length = length & 0x7F | high << 7
                    i += 1
                else:
                    length, i = read_varint(data, i - 1)
            if number in SKIPPED_BYTES:
                i += length
                continue
            if number not in ONCE or seen >> number & 1:
                return False
            seen |= 1 << number
            value = data[i : i + length]
            i += length
            if number == TOKENS:
                tokens = value
            elif number == ACTION_MASK:
                lengths.append(_count(value))
            elif number == TOKEN_MODEL_VERSIONS:
                # a negative int64 is a 10-byte varint: versions below 2^28 (4 bytes) are sure >= 0
                if not _ids_below(value, 0):
                    return False
                lengths.append(_count(value))
            elif number == REJECTED_TOKENS:
                rejected = value
            else:  # a float array
                if length % 4:
                    return False
                lengths.append(length >> 2)
                float_parts.append(value)
        elif wire_type == 0:
            value = data[i]
            i += 1
            if value >= 0x80:
                value, i = read_varint(data, i - 1)
            if number == PROMPT_LENGTH:
                prompt_length = value
            elif number == REJECTED_PROMPT_LENGTH:
                rejected_prompt_length = value
            elif number not in VARINTS:
                return False
            if value >= 1 << 31:  # negative, or beyond int32: let the parsed message decide
                return False
        elif wire_type == 1 and number in DOUBLES:
            if not math.isfinite(_DOUBLE.unpack_from(data, i)[0]):
                return False
            i += 8
        else:
            return False
    response = _count(tokens) - prompt_length
    if response <= 0:
        return False
    for n in lengths:
        if n != response and n:
            return False
    token_parts.append(tokens)
    if rejected:
        if rejected_prompt_length >= _count(rejected):
            return False
        token_parts.append(rejected)
    return True


def _ids_below(packed: bytes, vocab_size: int) -> bool:
    """Every varint of `packed` is at most MAX_ID_BYTES (4) long and (when vocab_size) below vocab_size.

    Byte p is the k-th of its varint (k = 0, 1, 2, 3) when the k bytes before it are continuation
    bytes (>= 0x80); it adds its low 7 bits << 7k, and a running sum read at each varint's last byte,
    minus the one at the previous last byte, is the value."""
    if not packed:
        return True
    raw = np.frombuffer(packed, dtype=np.uint8)
    cont = raw >= 0x80
    padded = np.concatenate((np.zeros(3, dtype=bool), cont))
    before = [padded[3 - k : 3 - k + len(cont)] for k in (1, 2, 3)]  # cont of the byte k places back
    run2 = before[0] & before[1]
    run3 = run2 & before[2]
    if (run3 & cont).any():  # a fifth byte follows
        return False
    if not vocab_size:
        return True
    position = before[0].astype(np.int32) + run2 + run3
    running = np.cumsum((raw & 0x7F).astype(np.int64) << (7 * position))
    values = np.diff(running[np.flatnonzero(~cont)], prepend=0)
    return int(values.max()) < vocab_size


def batch_ok(members: Sequence[bytes], vocab_size: int) -> bool:
    """True when every experience (its wire bytes in `members`) passes `validation`'s checks for sure."""
    token_parts: list[bytes] = []
    float_parts: list[bytes] = []
    for data in members:
        if not _scan(data, token_parts, float_parts):
            return False
    if not _ids_below(b"".join(token_parts), vocab_size):
        return False
    return not float_parts or bool(np.isfinite(np.frombuffer(b"".join(float_parts), dtype="<f4")).all())
