"""Reward scorers (gsm8k, math via math-verify, format, countdown), dispatch and managers."""

import pytest
import torch

from services.common.rewards import _math_verify_equal, extract_boxed, gsm8k_extract
from services.trainer.algorithms import (
    DAPORewardManager,
    NaiveRewardManager,
    TrainBatch,
    countdown_score,
    default_compute_score,
    format_score,
    get_reward_manager_cls,
    get_scorer,
    gsm8k_score,
    math_score,
    scorer_for_data_source,
)


def test_gsm8k_strict_and_flexible():
    text = "She has 3 + 4 = 7 apples.\n#### 1,234"
    assert gsm8k_extract(text) == "1234"
    assert gsm8k_score(text, "1234") == 1.0
    assert gsm8k_score(text, "1235") == 0.0
    assert gsm8k_score("the answer is 42", "42") == 0.0  # strict needs ####
    assert gsm8k_score("the answer is 42.", "42", method="flexible") == 1.0
    assert gsm8k_score("the answer is 42", "42", method="auto") == 1.0
    assert gsm8k_score("#### 41", "42", format_score=0.1) == 0.1
    assert gsm8k_score("#### 42.0", "42") == 1.0  # numeric comparison
    with pytest.raises(ValueError, match="method"):
        gsm8k_extract("x", method="lenient")


def test_gsm8k_searches_whole_text_unless_tail_given():
    text = "#### 72\n" + "x" * 400
    assert gsm8k_score(text, "72") == 1.0
    assert gsm8k_score(text, "72", tail_chars=300) == 0.0  # veRL's 300-char window misses it


@pytest.mark.parametrize(
    "solution,truth,expected",
    [
        ("so the answer is $\\boxed{\\frac{1}{2}}$", "0.5", 1.0),
        ("\\boxed{\\dfrac{2}{4}}", "\\frac{1}{2}", 1.0),
        ("\\boxed{3}", "4", 0.0),
        ("We get $x = \\boxed{2\\sqrt{2}}$.", "\\sqrt{8}", 1.0),
        ("\\boxed{\\text{Tuesday}}", "Tuesday", 1.0),
        ("\\boxed{Tuesday}", "Wednesday", 0.0),
    ],
)
def test_math_score(solution, truth, expected):
    assert math_score(solution, truth) == expected


def test_math_fallback_string_equality_when_unparsable():
    # math-verify finds nothing to parse in either side, so normalised strings are compared
    assert _math_verify_equal("???", "???") is None
    assert math_score("???", "???") == 1.0
    assert math_score("no solution", "No  Solution.") == 1.0
    assert math_score("no solution", "one solution") == 0.0
    assert extract_boxed("a \\boxed{x^{2}} b \\boxed{\\frac{1}{2}} end") == "\\frac{1}{2}"
    assert extract_boxed("no box") is None
    assert extract_boxed("\\boxed 5$") == "5"


def test_format_and_countdown():
    assert format_score("<think>hm</think>\n<answer>4</answer>") == 1.0
    assert format_score("<answer>4</answer>") == 0.0
    truth = {"target": 24, "numbers": [4, 6, 1]}
    assert countdown_score("<answer>4 * 6 * 1</answer>", truth) == 1.0
    assert countdown_score("<answer>(6 - 1) * 4</answer>", truth) == 0.1  # 20: valid but wrong
    assert countdown_score("<answer>4 * 6</answer>", truth) == 0.1  # not every number used
    assert countdown_score("<answer>__import__('os')</answer>", truth) == 0.1  # never evaluated
    assert countdown_score("<answer>4 / (1 - 1) * 6</answer>", truth) == 0.1
    assert countdown_score("no answer", truth) == 0.0


def test_dispatch_by_data_source():
    assert scorer_for_data_source("openai/gsm8k") is gsm8k_score
    assert scorer_for_data_source("HuggingFaceH4/MATH-500") is math_score
    assert scorer_for_data_source("aime2024") is math_score
    assert scorer_for_data_source("format") is format_score
    assert default_compute_score("openai/gsm8k", "#### 3", "3") == 1.0
    with pytest.raises(NotImplementedError, match="no reward scorer for data_source 'unknown/set'"):
        scorer_for_data_source("unknown/set")
    assert get_scorer("services.trainer.algorithms:countdown_score") is countdown_score


class CharTokenizer:
    """Token id = ord(char); id 0 is a special pad token, id 1 the EOS."""

    eos_token = "</s>"

    def decode(self, ids, skip_special_tokens=True):
        out = []
        for i in ids:
            if i in (0, 1):
                if not skip_special_tokens:
                    out.append("" if i == 0 else self.eos_token)
                continue
            out.append(chr(i))
        return "".join(out)


def _batch(texts, truths, length=12, source="openai/gsm8k"):
    responses = torch.zeros(len(texts), length, dtype=torch.long)
    mask = torch.zeros(len(texts), length)
    for i, text in enumerate(texts):
        ids = [ord(c) for c in text][:length]
        responses[i, : len(ids)] = torch.tensor(ids, dtype=torch.long) if ids else responses[i, :0]
        mask[i, : len(ids)] = 1
    return TrainBatch(
        response_mask=mask, responses=responses, data_sources=[source] * len(texts), ground_truths=truths
    )


def test_naive_manager_writes_score_at_last_valid_token():
    batch = _batch(["#### 7", "#### 8", ""], ["7", "7", "7"])
    result = NaiveRewardManager(CharTokenizer())(batch)
    expected = torch.zeros(3, 12)
    expected[0, 5] = 1.0
    assert torch.equal(result.reward_tensor, expected)  # wrong answer -> 0; empty response -> zero row
    assert result.reward_extra_info["acc"] == [1.0, 0.0, 0.0]


def test_manager_returns_rm_scores_and_named_scorer():
    batch = _batch(["ab"], ["x"])
    scores = torch.full((1, 12), 0.5)
    assert NaiveRewardManager(CharTokenizer())(batch.replace(rm_scores=scores)).reward_tensor is scores
    batch = _batch(["<answer>1+2</answer>"], [{"target": 3, "numbers": [1, 2]}], length=24, source="anything")
    manager = get_reward_manager_cls("naive")(
        CharTokenizer(), compute_score="countdown", scorer_args={"score": 2.0}
    )
    assert manager(batch).reward_tensor[0, 19].item() == 2.0


def test_manager_dict_scores_need_score_key():
    batch = _batch(["#### 7"], ["7"])
    ok = NaiveRewardManager(CharTokenizer(), compute_score=lambda s, t, g, e: {"score": 0.5, "pred": t})(
        batch
    )
    assert ok.reward_extra_info == {"score": [0.5], "pred": ["#### 7"]}
    with pytest.raises(ValueError, match="without 'score'"):
        NaiveRewardManager(CharTokenizer(), compute_score=lambda s, t, g, e: {"acc": 1})(batch)


def test_dapo_overlong_penalty_is_linear_in_the_buffer():
    texts = ["#### 7", "#### 7" + "." * 4, "#### 7" + "." * 6]  # lengths 6, 10, 12
    batch = _batch(texts, ["7"] * 3)
    manager = DAPORewardManager(
        CharTokenizer(),
        max_resp_len=12,
        overlong_buffer_cfg={"enable": True, "len": 8, "penalty_factor": 1.0, "log": True},
    )
    result = manager(batch)
    # expected length 12 - 8 = 4: penalties -(6-4)/8, -(10-4)/8, -(12-4)/8
    assert result.reward_tensor[0, 5].item() == pytest.approx(1 - 0.25)
    assert result.reward_tensor[1, 9].item() == pytest.approx(1 - 0.75)
    assert result.reward_tensor[2, 11].item() == pytest.approx(0.0)
    assert result.reward_extra_info["overlong"] == [True, True, True]
    off = DAPORewardManager(CharTokenizer())(batch)
    assert off.reward_tensor.sum().item() == pytest.approx(3.0)
    with pytest.raises(ValueError, match="max_resp_len"):
        DAPORewardManager(CharTokenizer(), overlong_buffer_cfg={"enable": True})
    with pytest.raises(ValueError, match="unknown key 'length'"):
        DAPORewardManager(CharTokenizer(), overlong_buffer_cfg={"length": 4})


def test_dapo_strips_trailing_eos_string():
    class EosTextTokenizer(CharTokenizer):
        def decode(self, ids, skip_special_tokens=True):
            return super().decode(ids, skip_special_tokens) + "</s>"

    batch = _batch(["#### 7"], ["7"])
    seen = []
    DAPORewardManager(EosTextTokenizer(), compute_score=lambda s, t, g, e: seen.append(t) or 1.0)(batch)
    assert seen == ["#### 7"]
