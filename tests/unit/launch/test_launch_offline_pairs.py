"""Offline DPO pairs: a {prompt, chosen, rejected} row becomes one pair experience, tokenised as the
explorer would (prompt ids, response ids, EOS), under the format's `chosen_key`/`rejected_key`."""

from __future__ import annotations

import pytest
import yaml

from launcher.offline_data import build_experiences
from launcher.tiny_model import make_tiny_model
from services.common.config import FormatConfig, load_config
from services.common.experience import from_proto, to_proto
from services.common.modeling import load_tokenizer


def test_pair_rows_become_pair_experiences(tmp_path):
    tok = load_tokenizer(make_tiny_model(tmp_path / "m"))
    fmt = FormatConfig(prompt_type="plaintext", prompt_key="q", chosen_key="good", rejected_key="bad")
    (exp,) = build_experiences([{"q": "3+4=", "good": "7", "bad": [{"role": "assistant", "content": "9"}]}],
                               tok, fmt, pairs=True)  # fmt: skip
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    assert exp.tokens.tolist() == enc("3+4=") + enc("7") + [tok.eos_token_id]
    assert exp.rejected_tokens.tolist() == enc("3+4=") + enc("9") + [tok.eos_token_id]
    assert exp.prompt_length == exp.rejected_prompt_length == len(enc("3+4="))
    back = from_proto(to_proto(exp))  # the pair survives the wire to the buffer
    assert back.rejected_tokens.tolist() == exp.rejected_tokens.tolist()
    with pytest.raises(ValueError, match="'q', 'good', 'bad'"):
        build_experiences([{"q": "1", "good": "2"}], tok, fmt, source="pairs.jsonl", pairs=True)


@pytest.mark.parametrize(
    ("algorithm", "pairwise"),
    [({"algorithm_type": "dpo"}, True), ({"algorithm_type": "sft", "policy_loss_fn": "dpo"}, True),
     ({"algorithm_type": "sft"}, False), ({"algorithm_type": "dpo", "policy_loss_fn": "sft"}, False)],
)  # fmt: skip
def test_the_algorithm_says_whether_rows_are_pairs(algorithm, pairwise):
    assert load_config(text=yaml.safe_dump({"algorithm": algorithm})).algorithm.pairwise is pairwise
