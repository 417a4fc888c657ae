"""`token_model_versions` (per response token, the version that sampled it) in buffer validation: empty
or of the response length, every entry >= 0, on the wire fast path and on the parsed message alike;
and the Experience codec carries it exactly."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from services.buffer import wire_check
from services.buffer.records import ValidationError, WireBatch
from services.buffer.validation import Limits, validate_batch
from services.common.experience import Experience, experiences_equal, from_proto, to_proto
from tests.support.buffer_data import batch, group


def _checked(b) -> tuple[bool, str | None]:
    """(fast path passed, the error the full checks name or None)."""
    wire = WireBatch.parse(b.SerializeToString())
    fast = wire_check.batch_ok(wire.members, 1000)
    try:
        validate_batch(wire.message, Limits(vocab_size=1000), wire.size, wire.members)
        error = None
    except ValidationError as exc:
        error = str(exc)
    return fast, error


def test_per_token_versions_of_the_response_length_pass_the_fast_path():
    b = batch(group("a", 2, prompt=3, response=5), vocab_size=1000)
    b.experiences[0].token_model_versions.extend([4, 4, 5, 5, 5])
    b.experiences[1].token_model_versions.extend([(1 << 27) + 1] * 5)
    assert _checked(b) == (True, None)


@pytest.mark.parametrize(
    ("versions", "message"),
    [
        ([4, 4, 5], "experiences[0].token_model_versions: length 3 != response length 5"),
        ([4, 4, 5, 5, 5, 5], "experiences[0].token_model_versions: length 6 != response length 5"),
        ([4, 4, -1, 5, 5], "experiences[0].token_model_versions[2]: model version -1 < 0"),
    ],
)
def test_bad_per_token_versions_are_refused_naming_the_field(versions, message):
    b = batch(group("a", 1, prompt=3, response=5), vocab_size=1000)
    b.experiences[0].token_model_versions.extend(versions)
    fast, error = _checked(b)
    assert not fast
    assert error is not None and message in error


def test_large_versions_take_the_slow_path_and_pass():
    b = batch(group("a", 1, prompt=3, response=2), vocab_size=1000)
    b.experiences[0].token_model_versions.extend([1 << 40, 1 << 40])
    assert _checked(b) == (False, None)


def test_the_codec_round_trips_per_token_versions():
    exp = Experience(
        tokens=[1, 2, 3, 4, 5],
        prompt_length=2,
        logprobs=[-0.1, -0.2, -0.3],
        model_version=3,
        token_model_versions=[3, 4, 4],
    )
    back = from_proto(to_proto(exp))
    assert experiences_equal(exp, back)
    assert back.token_model_versions.dtype == torch.int64
    assert back.versions_per_token().tolist() == [3, 4, 4]
    plain = from_proto(to_proto(Experience(tokens=[1, 2, 3], prompt_length=1, model_version=2)))
    assert plain.token_model_versions is None
    assert plain.versions_per_token().tolist() == [2, 2]


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 6),
    st.lists(st.sampled_from([0, 1, 7, (1 << 28) - 1, 1 << 28, 1 << 40, -1, -(1 << 40)]), max_size=8),
)
def test_the_fast_path_passes_only_what_the_message_checks_pass(response, versions):
    b = batch(group("a", 1, prompt=2, response=response), vocab_size=1000)
    b.experiences[0].token_model_versions.extend(versions)
    fast, error = _checked(b)
    if fast:
        assert error is None
    ok = not versions or (len(versions) == response and min(versions) >= 0)
    assert (error is None) == ok
