"""The wire-bytes fast path of validation (`wire_check.batch_ok`) never passes a batch that the checks on
the parsed message refuse, and passes the well-formed batches producers send."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rft.v1 import experience_pb2

from services.buffer import wire_check
from services.buffer.records import ValidationError, WireBatch
from services.buffer.validation import Limits, validate_batch, validate_experience
from tests.support.buffer_data import batch, group

FINITE = st.floats(width=32, allow_nan=False, allow_infinity=False)
FLOATS = st.one_of(FINITE, FINITE, FINITE, st.sampled_from([math.nan, math.inf, -math.inf]))
INT32 = st.one_of(st.integers(-3, 40), st.sampled_from([-(1 << 31), (1 << 31) - 1, 1 << 27, 1 << 28]))


@st.composite
def experiences(draw) -> experience_pb2.Experience:
    n = draw(st.integers(0, 12))
    response = draw(st.integers(-1, n + 1))
    exp = experience_pb2.Experience(
        tokens=draw(
            st.lists(st.one_of(st.integers(0, 999), st.integers(0, 999), INT32), min_size=n, max_size=n)
        ),
        prompt_length=n - response if draw(st.booleans()) else draw(INT32),
        model_version=draw(st.sampled_from([0, 3, 3, -1, 1 << 40])),
        use_count=draw(st.sampled_from([0, 2, 2, -5])),
        truncated=draw(st.booleans()),
        prompt_text=draw(st.sampled_from(["", "q"])),
    )
    exp.eid.group_id = "g"
    exp.metrics["m"] = 1.0
    for name in ("logprobs", "token_level_rewards", "advantages", "teacher_logprobs"):
        length = draw(st.sampled_from([0, 0, max(response, 0), max(response, 0) + 1]))
        getattr(exp, name).extend(draw(st.lists(FLOATS, min_size=length, max_size=length)))
    length = draw(st.sampled_from([0, max(response, 0), 1]))
    exp.action_mask.extend([True] * length)
    if draw(st.booleans()):
        exp.reward = draw(FLOATS)
    if draw(st.booleans()):
        exp.reward_baseline = draw(FLOATS)
    if draw(st.booleans()):
        exp.rejected_tokens.extend(draw(st.lists(INT32, min_size=1, max_size=4)))
        exp.rejected_prompt_length = draw(st.integers(-1, 5))
    return exp


def _proto_ok(exps: list[experience_pb2.Experience], vocab_size: int) -> bool:
    try:
        for i, exp in enumerate(exps):
            validate_experience(exp, i, vocab_size)
    except ValidationError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(st.lists(experiences(), min_size=1, max_size=4), st.sampled_from([0, 1000, 1 << 28]))
def test_fast_path_passes_only_what_the_message_checks_pass(exps, vocab_size):
    wire = WireBatch.parse(experience_pb2.ExperienceBatch(experiences=exps).SerializeToString())
    if wire_check.batch_ok(wire.members, vocab_size):
        assert _proto_ok(list(wire.message.experiences), vocab_size)


def test_producer_batches_take_the_fast_path():
    b = batch(group("a", 8, prompt=64, response=192), group("b", 8, response=1), vocab_size=1000)
    b.experiences[0].rejected_tokens[:] = [5, 6, 999]
    b.experiences[0].rejected_prompt_length = 2
    b.experiences[1].tokens[-1] = 999
    wire = WireBatch.parse(b.SerializeToString())
    assert wire_check.batch_ok(wire.members, 1000)
    assert wire_check.batch_ok(wire.members, 0)
    assert not wire_check.batch_ok(wire.members, 999)  # then the message checks name the token
    with pytest.raises(ValidationError) as with_wire:
        validate_batch(wire.message, Limits(vocab_size=999), wire.size, wire.members)
    with pytest.raises(ValidationError) as without:
        validate_batch(wire.message, Limits(vocab_size=999))
    assert str(with_wire.value) == str(without.value)
    assert "token id 999 >= vocab_size 999" in str(without.value)


@pytest.mark.parametrize("token", [127, 128, 16383, 16384, (1 << 21) - 1, 1 << 21, (1 << 28) - 1])
def test_token_ids_decoded_across_varint_lengths(token):
    b = batch(group("a", 1))
    b.experiences[0].tokens[:] = [1, 127, token, 0, 5, 6, 7, 8]
    wire = WireBatch.parse(b.SerializeToString())
    assert wire_check.batch_ok(wire.members, token + 1)
    assert not wire_check.batch_ok(wire.members, token)


def test_unexpected_encodings_go_to_the_message_checks():
    b = batch(group("a", 1))
    packed = WireBatch.parse(b.SerializeToString()).members[0]
    unpacked_tokens = packed + b"\x10\x05"  # one more token, sent unpacked (field 2, varint)
    split_logprobs = packed + b"\x22\x04\x00\x00\x80\xbf"  # a second piece of logprobs
    for data in (unpacked_tokens, split_logprobs):
        assert not wire_check.batch_ok([data], 1000)
        experience_pb2.Experience.FromString(data)  # still a well-formed message
