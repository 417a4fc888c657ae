"""Token ids are checked against the model's vocabulary (`Limits.vocab_size`); a batch's own vocab_size
may narrow that bound but never widen it; with neither known, only ids < 0 are refused."""

from __future__ import annotations

import pytest

from services.buffer.records import ValidationError
from services.buffer.validation import Limits, effective_vocab_size, validate_batch
from tests.support.buffer_data import batch, group


@pytest.mark.parametrize(
    ("declared", "known", "bound"),
    [(0, 0, 0), (0, 1000, 1000), (500, 1000, 500), (1 << 30, 1000, 1000), (700, 0, 700)],
)
def test_effective_vocab_size(declared, known, bound):
    assert effective_vocab_size(declared, known) == bound


def _with_token(token: int, vocab_size: int):
    b = batch(group("a", 2), vocab_size=vocab_size)
    b.experiences[0].tokens[:] = [1, 2, 3, 4, 5, 6, 7, token]
    return b


def test_model_vocabulary_bounds_every_batch():
    limits = Limits(vocab_size=1000)
    validate_batch(_with_token(999, 0), limits)
    for token, declared, bound in (((1 << 31) - 1, 0, 1000), (1500, 4000, 1000), (600, 500, 500)):
        with pytest.raises(ValidationError, match=f"token id {token} >= vocab_size {bound}") as err:
            validate_batch(_with_token(token, declared), limits)
        assert err.value.field == "experiences[0].tokens[7]"


def test_without_a_known_vocabulary_only_the_batch_bounds_ids():
    validate_batch(_with_token((1 << 31) - 1, 0), Limits())
    with pytest.raises(ValidationError, match="experiences\\[0\\].tokens\\[7\\]"):
        validate_batch(_with_token(1000, 1000), Limits())
