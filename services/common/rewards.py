"""Rule-based reward scorers, shared by the explorer (workflows score rollouts) and the trainer
(reward managers): gsm8k, math, format, countdown, reasoning_gym (each reasoning-gym dataset's own
``score_answer``), and dispatch by ``data_source``.

A scorer is ``fn(solution_str, ground_truth, extra_info=None, **options) -> float | dict`` (a dict
must hold ``"score"``; its other keys become per-sample extra info).  Scorers are registered by
name; a plug-in is a dotted path ``"pkg.mod:fn"`` with the same signature.  ``default_compute_score``
has veRL's ``(data_source, solution_str, ground_truth, extra_info)`` form and picks the scorer
from the data source.
"""

from __future__ import annotations

import ast
import operator
import re
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from services.common.reasoning_gym_tasks import reasoning_gym_score
from services.common.registry import Registry

__all__ = [
    "DATA_SOURCE_SCORERS",
    "REWARD_SCORERS",
    "get_scorer",
    "countdown_score",
    "default_compute_score",
    "extract_boxed",
    "format_score",
    "gsm8k_extract",
    "gsm8k_score",
    "math_score",
    "scorer_for_data_source",
]

REWARD_SCORERS: Registry[Callable[..., Any]] = Registry("reward scorer")


def get_scorer(name: str) -> Callable[..., Any]:
    """Reward scorer ``(solution_str, ground_truth, extra_info=None, **options)`` by name or plug-in path."""
    return REWARD_SCORERS.get(name)


# ---------------------------------------------------------------- gsm8k
_STRICT = re.compile(r"#### ?(\-?[0-9\.\,]+)")
_FLEXIBLE = re.compile(r"(\-?[0-9\.\,]+)")


def gsm8k_extract(solution_str: str, method: str = "strict", tail_chars: int | None = None) -> str | None:
    """Extract the final numeric answer.

    ``strict``: the last ``#### <number>``; ``flexible``: the last number that is not "" or ".";
    ``auto``: strict, falling back to flexible when there is no ``####`` (answers without the
    marker are not scored 0, veRL issue #2150).  ``tail_chars`` searches only the last N characters
    (veRL hard-codes 300; the default here searches the whole text).  Commas and ``$`` are removed.
    """
    if method not in ("strict", "flexible", "auto"):
        raise ValueError(f"gsm8k method must be 'strict', 'flexible' or 'auto', got {method!r}")
    text = solution_str[-tail_chars:] if tail_chars else solution_str
    answer: str | None = None
    if method in ("strict", "auto"):
        found = _STRICT.findall(text)
        answer = found[-1] if found else None
    if answer is None and method in ("flexible", "auto"):
        answer = next((a for a in reversed(_FLEXIBLE.findall(text)) if a not in ("", ".")), None)
    return None if answer is None else answer.replace(",", "").replace("$", "")


def _as_number(text: str) -> float | None:
    try:
        return float(text.replace(",", "").replace("$", "").rstrip("."))
    except ValueError:
        return None


@REWARD_SCORERS.register("gsm8k")
def gsm8k_score(
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    method: str = "strict",
    tail_chars: int | None = None,
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """GSM8K: ``score`` if the extracted answer equals the ground truth, ``format_score`` if an
    answer was extracted but is wrong, 0 if none was.  Equality is numeric when both sides parse
    as numbers ("1,000" = "1000.0"), else exact string equality.
    Dataset: https://arxiv.org/abs/2110.14168.
    """
    del extra_info
    answer = gsm8k_extract(solution_str, method=method, tail_chars=tail_chars)
    if answer is None:
        return 0.0
    truth = str(ground_truth).strip()
    a, b = _as_number(answer), _as_number(truth)
    correct = (a == b) if a is not None and b is not None else answer == truth
    return score if correct else format_score


# ---------------------------------------------------------------- math
def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (balanced braces) or ``\\boxed x``; None if absent."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    if i < len(text) and text[i] == " ":
        return text[i + 1 :].split("$")[0].strip() or None
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def _normalize_math_string(text: str) -> str:
    text = re.sub(r"\\text\{(.*?)\}", r"\1", text)
    for token in ("\\left", "\\right", "\\!", "\\,", "\\;", "$", "\\displaystyle", "dfrac", "tfrac"):
        text = text.replace(token, "frac" if token in ("dfrac", "tfrac") else "")
    return re.sub(r"\s+", "", text).rstrip(".").lower()


def _math_verify_equal(prediction: str, truth: str) -> bool | None:
    """True/False from math-verify, or None when either side cannot be parsed."""
    from math_verify import parse, verify  # imported lazily: sympy is slow to import

    # math-verify guards parsing with signal.alarm, which only works in the main thread
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    try:
        gold = parse(truth, parsing_timeout=timeout) or parse(f"${truth}$", parsing_timeout=timeout)
        pred = parse(prediction, parsing_timeout=timeout)
        if not gold or not pred:
            return None
        return bool(verify(gold, pred, timeout_seconds=timeout))
    except Exception:  # math-verify raises assorted errors on odd LaTeX; treat as "cannot parse"
        return None


@REWARD_SCORERS.register("math")
def math_score(
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    correct_score: float = 1.0,
    wrong_score: float = 0.0,
) -> float:
    """Math answers compared with math-verify (https://github.com/huggingface/Math-Verify):
    symbolic/numeric equivalence of the final answer (``\\boxed{}`` preferred) and the ground
    truth.  Only when math-verify cannot parse one side, the last ``\\boxed{}`` content (or the
    whole answer) and the ground truth are compared as normalised strings.
    Dataset: MATH, https://arxiv.org/abs/2103.03874.
    """
    del extra_info
    truth = str(ground_truth)
    verdict = _math_verify_equal(solution_str, truth)
    if verdict is None:
        candidate = extract_boxed(solution_str)
        candidate = solution_str if candidate is None else candidate
        verdict = _normalize_math_string(candidate) == _normalize_math_string(truth)
    return correct_score if verdict else wrong_score


# ---------------------------------------------------------------- format
DEFAULT_FORMAT_PATTERN = r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$"


@REWARD_SCORERS.register("format")
def format_score(
    solution_str: str,
    ground_truth: Any = None,
    extra_info: Mapping[str, Any] | None = None,
    pattern: str = DEFAULT_FORMAT_PATTERN,
    correct_score: float = 1.0,
    wrong_score: float = 0.0,
) -> float:
    """``correct_score`` if the whole response matches ``pattern`` (default
    ``<think>…</think><answer>…</answer>``, DeepSeek-R1 https://arxiv.org/abs/2501.12948), else
    ``wrong_score``.  ``ground_truth`` is ignored."""
    del ground_truth, extra_info
    return correct_score if re.match(pattern, solution_str, flags=re.DOTALL) else wrong_score


# ---------------------------------------------------------------- countdown
_OPS: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def _eval_arithmetic(node: ast.AST) -> tuple[float, list[int]]:
    """Value of + − × ÷ over integer literals, and the literals used; ValueError otherwise."""
    if isinstance(node, ast.Expression):
        return _eval_arithmetic(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return float(node.value), [node.value]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value, used = _eval_arithmetic(node.operand)
        return -value, used
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, used_l = _eval_arithmetic(node.left)
        right, used_r = _eval_arithmetic(node.right)
        try:
            return _OPS[type(node.op)](left, right), used_l + used_r
        except ZeroDivisionError as exc:
            raise ValueError("division by zero") from exc
    raise ValueError(f"not allowed in a countdown equation: {ast.dump(node)[:60]}")


@REWARD_SCORERS.register("countdown")
def countdown_score(
    solution_str: str,
    ground_truth: Mapping[str, Any],
    extra_info: Mapping[str, Any] | None = None,
    format_score: float = 0.1,
    score: float = 1.0,
) -> float:
    """Countdown (TinyZero, https://github.com/Jiayi-Pan/TinyZero): the last ``<answer>…</answer>``
    must be an arithmetic expression using each of ``ground_truth["numbers"]`` exactly once and
    equal ``ground_truth["target"]`` (|diff| < 1e-5): ``score``.  A well-formed but wrong or
    invalid equation: ``format_score``; no answer: 0.  Evaluated with ``ast``, never ``eval``.
    """
    del extra_info
    answers = re.findall(r"<answer>(.*?)</answer>", solution_str, flags=re.DOTALL)
    if not answers:
        return 0.0
    equation = answers[-1].strip().split("=")[0]
    try:
        value, used = _eval_arithmetic(ast.parse(equation, mode="eval"))
    except (SyntaxError, ValueError, RecursionError):
        return format_score
    if Counter(used) != Counter(int(n) for n in ground_truth["numbers"]):
        return format_score
    return score if abs(value - float(ground_truth["target"])) < 1e-5 else format_score


# ---------------------------------------------------------------- reasoning-gym
# each dataset's own `score_answer` (services/common/reasoning_gym_tasks.py; the `reasoning-gym` extra)
REWARD_SCORERS.add("reasoning_gym", reasoning_gym_score)


# ---------------------------------------------------------------- dispatch
DATA_SOURCE_SCORERS: Mapping[str, str] = {
    "openai/gsm8k": "gsm8k",
    "gsm8k": "gsm8k",
    "lighteval/MATH": "math",
    "DigitalLearningGmbH/MATH-lighteval": "math",
    "HuggingFaceH4/MATH-500": "math",
    "math": "math",
    "math_dapo": "math",
    "math_dapo_reasoning": "math",
    "countdown": "countdown",
    "reasoning_gym": "reasoning_gym",
}
_PREFIX_SCORERS = (("aime", "math"), ("countdown", "countdown"))


def scorer_for_data_source(data_source: str) -> Callable[..., Any]:
    """The scorer for a dataset's ``data_source`` (exact name, ``aime*`` prefix, or a scorer name)."""
    if data_source in DATA_SOURCE_SCORERS:
        return get_scorer(DATA_SOURCE_SCORERS[data_source])
    for prefix, name in _PREFIX_SCORERS:
        if data_source.startswith(prefix):
            return get_scorer(name)
    if data_source in REWARD_SCORERS:
        return get_scorer(data_source)
    raise NotImplementedError(
        f"no reward scorer for data_source {data_source!r}; known sources: "
        f"{', '.join(sorted(DATA_SOURCE_SCORERS))}, aime*; or name a scorer ({', '.join(REWARD_SCORERS)}) "
        "or a plug-in 'pkg.mod:fn'"
    )


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Mapping[str, Any] | None = None
) -> float | dict[str, Any]:
    """veRL-style ``compute_score``: choose the scorer by ``data_source`` and apply it."""
    return scorer_for_data_source(data_source)(solution_str, ground_truth, extra_info)
