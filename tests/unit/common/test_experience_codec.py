"""Experience <-> proto codec: random experiences round-trip bit-exactly, through bytes too."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rft.v1 import experience_pb2

from services.common.experience import (
    Experience,
    ExperienceCodecError,
    ExperienceId,
    batch_from_proto,
    batch_to_proto,
    experiences_equal,
    from_proto,
    to_proto,
)

f32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
text = st.text(max_size=20)


@st.composite
def experiences(draw) -> Experience:
    prompt = draw(st.integers(0, 12))
    resp = draw(st.integers(0, 12))
    tokens = draw(st.lists(st.integers(0, 2**31 - 1), min_size=prompt + resp, max_size=prompt + resp))

    def opt_floats():
        return draw(
            st.one_of(st.none(), st.lists(f32, min_size=resp, max_size=resp).filter(lambda x: len(x) > 0))
        )

    return Experience(
        tokens=tokens,
        prompt_length=prompt,
        eid=ExperienceId(
            batch_id=draw(text),
            task_id=draw(text),
            run_id=draw(st.integers(0, 99)),
            step=draw(st.integers(0, 10**6)),
            suffix=draw(text),
            group_id=draw(text),
            explorer_id=draw(text),
        ),
        logprobs=opt_floats(),
        action_mask=draw(
            st.one_of(st.none(), st.lists(st.booleans(), min_size=max(resp, 1), max_size=max(resp, 1)))
        ),
        reward=draw(st.one_of(st.none(), st.floats(allow_nan=True))),
        token_level_rewards=opt_floats(),
        truncated=draw(st.booleans()),
        model_version=draw(st.integers(0, 2**40)),
        metrics=draw(st.dictionaries(text, st.floats(allow_nan=False), max_size=3)),
        info=draw(st.dictionaries(text, text, max_size=3)),
        prompt_text=draw(text),
        response_text=draw(text),
        advantages=opt_floats(),
        returns=opt_floats(),
        teacher_logprobs=opt_floats(),
        use_count=draw(st.integers(0, 5)),
        rejected_tokens=draw(st.one_of(st.none(), st.lists(st.integers(0, 1000), min_size=1, max_size=8))),
        rejected_prompt_length=draw(st.integers(0, 3)),
    )


@settings(max_examples=200, deadline=None)
@given(experiences())
def test_roundtrip_is_exact(exp):
    msg = to_proto(exp)
    back = from_proto(experience_pb2.Experience.FromString(msg.SerializeToString()))
    assert experiences_equal(exp, back)
    assert to_proto(back) == msg


@settings(max_examples=30, deadline=None)
@given(st.lists(experiences(), max_size=5))
def test_batch_roundtrip(exps):
    msg = batch_to_proto(exps, vocab_size=512, producer_id="explorer-0")
    wire = experience_pb2.ExperienceBatch.FromString(msg.SerializeToString())
    assert wire.vocab_size == 512 and wire.producer_id == "explorer-0"
    back = batch_from_proto(wire)
    assert len(back) == len(exps) and all(experiences_equal(a, b) for a, b in zip(exps, back, strict=True))


def test_dtypes_and_views():
    exp = Experience(tokens=[5, 6, 7, 8], prompt_length=1, logprobs=[-0.1, -0.2, -0.3], action_mask=[1, 1, 0])
    assert exp.tokens.dtype == torch.int64 and exp.logprobs.dtype == torch.float32
    assert exp.action_mask.dtype == torch.bool
    assert exp.response_length == 3 and exp.prompt_tokens.tolist() == [5]
    assert exp.response_tokens.tolist() == [6, 7, 8]


def test_absent_reward_stays_absent_and_nan_survives():
    assert from_proto(to_proto(Experience(tokens=[1], prompt_length=1))).reward is None
    back = from_proto(to_proto(Experience(tokens=[1], prompt_length=1, reward=float("nan"))))
    assert math.isnan(back.reward)


def test_out_of_range_token_refused():
    with pytest.raises(ExperienceCodecError, match="tokens"):
        to_proto(Experience(tokens=[2**31], prompt_length=0))


def test_equality_detects_single_bit_difference():
    a = Experience(tokens=[1, 2], prompt_length=1, logprobs=[0.5])
    b = Experience(tokens=[1, 2], prompt_length=1, logprobs=[0.5000001])
    assert not experiences_equal(a, b)


def test_codec_tables_cover_every_field():
    """A field added to Experience or ExperienceId crosses the proto only if the codec's tables name it."""
    from dataclasses import fields

    from services.common import experience as codec

    named = {"tokens", "eid", *codec._PLAIN, *codec._MAPS, *codec._OPTIONAL_FLOATS, *codec._ARRAYS}
    assert sorted(named) == sorted(f.name for f in fields(Experience))
    assert set(codec._ID_FIELDS) == set(experience_pb2.ExperienceId.DESCRIPTOR.fields_by_name)
    assert named == set(experience_pb2.Experience.DESCRIPTOR.fields_by_name)
