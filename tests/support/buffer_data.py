"""Experience batches for buffer tests and benchmarks: groups with unique, checkable ids."""

from __future__ import annotations

import random

from rft.v1 import experience_pb2

from services.buffer.records import GroupRecord, group_records


def experience(
    group_id: str,
    index: int,
    *,
    prompt: int = 4,
    response: int = 4,
    model_version: int = 0,
    explorer_id: str = "",
    rng: random.Random | None = None,
) -> experience_pb2.Experience:
    rng = rng or random.Random(hash((group_id, index)) & 0xFFFF)
    return experience_pb2.Experience(
        eid=experience_pb2.ExperienceId(group_id=group_id, suffix=str(index), explorer_id=explorer_id),
        tokens=[rng.randrange(1000) for _ in range(prompt + response)],
        prompt_length=prompt,
        logprobs=[-rng.random() for _ in range(response)],
        action_mask=[True] * response,
        reward=1.0,
        model_version=model_version,
    )


def group(group_id: str, n: int, **kw) -> list[experience_pb2.Experience]:
    return [experience(group_id, i, **kw) for i in range(n)]


def batch(*groups: list[experience_pb2.Experience], vocab_size: int = 0, producer_id: str = ""):
    exps = [e for g in groups for e in g]
    return experience_pb2.ExperienceBatch(experiences=exps, vocab_size=vocab_size, producer_id=producer_id)


def records(*groups: list[experience_pb2.Experience]) -> list[GroupRecord]:
    return group_records([e for g in groups for e in g])


def uid(exp: experience_pb2.Experience) -> str:
    return f"{exp.eid.explorer_id}/{exp.eid.group_id}/{exp.eid.suffix}"


def decode_uids(payloads: list[bytes]) -> list[str]:
    from rft.v1 import buffer_pb2

    return [uid(e) for e in buffer_pb2.GetBatchResponse.FromString(b"".join(payloads)).experiences]
