"""`rft convert-verl` as a user runs it: the installed `rft` command in a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from services.common.config import load_config

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "convert_verl"
_VENV_RFT = ROOT / ".venv" / "bin" / "rft"
RFT = [str(_VENV_RFT)] if _VENV_RFT.exists() else [sys.executable, "-m", "launcher.cli"]


def rft(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RFT, *args], input=stdin, capture_output=True, text=True, cwd=ROOT, timeout=120)


def test_converts_a_script_to_a_file_that_config_show_reads(tmp_path):
    out = tmp_path / "ppo.yaml"
    result = rft("convert-verl", str(FIXTURES / "run_qwen2-7b_rm.sh"), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert (
        "warning: " in result.stderr
        and "critic.ppo_micro_batch_size_per_gpu=32: no equivalent" in result.stderr
    )
    assert f"wrote {out}" in result.stderr
    assert "# veRL critic.ppo_micro_batch_size_per_gpu=32: no equivalent (" in out.read_text()
    shown = rft("config", "show", str(out))
    assert shown.returncode == 0, shown.stderr
    resolved = yaml.safe_load(shown.stdout)["resolved"]
    assert resolved["gpu_split"] == {"total": 8, "rollout": 2, "auxiliary": 2, "trainer": 4}
    assert resolved["train_batch_size"] == 1024


def test_reads_stdin_and_writes_stdout():
    result = rft(
        "convert-verl", "-", stdin="N=4\npython3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.n=$N\n"
    )
    assert result.returncode == 0, result.stderr
    config = load_config(text=result.stdout)
    assert config.algorithm.repeat_times == 4


def test_several_commands_give_numbered_files(tmp_path):
    script = tmp_path / "two.sh"
    script.write_text(
        "python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo\n"
        "python3 -m verl.trainer.main_ppo algorithm.adv_estimator=rloo\n"
    )
    result = rft("convert-verl", str(script), "-o", str(tmp_path / "run.yaml"))
    assert result.returncode == 0, result.stderr
    assert load_config(tmp_path / "run.yaml").algorithm.algorithm_type == "grpo"
    assert load_config(tmp_path / "run-2.yaml").algorithm.algorithm_type == "rloo"


def test_no_verl_command_or_no_file_exits_2(tmp_path):
    script = tmp_path / "prep.sh"
    script.write_text("python3 examples/data_preprocess/gsm8k.py --local_dir ~/data/gsm8k\n")
    result = rft("convert-verl", str(script))
    assert result.returncode == 2
    assert "no veRL command found" in result.stderr and "verl.trainer.main_ppo" in result.stderr
    missing = rft("convert-verl", str(tmp_path / "absent.sh"))
    assert missing.returncode == 2 and "no such file" in missing.stderr
