"""bench/colocate_sleep.py on the CPU with the tiny model, one step: the JSON last line carries the ratio
of a step with the hf engine's sleep/wake to one without, and the engine parked every weight byte."""

from __future__ import annotations

import json

import pytest
import torch

from bench.colocate_sleep import main


def test_one_step_reports_the_ratio_and_the_parked_bytes(capsys):
    threads = torch.get_num_threads()
    try:
        result = main(
            ["--size", "tiny", "--device", "cpu", "--steps", "1", "--batch", "1", "--max-tokens", "2"]
        )
    finally:
        torch.set_num_threads(threads)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result
    assert result["ratio"] == pytest.approx(result["colocated_step_s"] / result["baseline_step_s"], rel=1e-3)
    assert result["sleep_s"] > 0 and result["wake_s"] > 0
    assert result["parked_bytes"] >= 1_000_000 * 4  # the tiny model's ~1.1M fp32 parameters, all parked
