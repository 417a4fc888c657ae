"""`rft run --plugin-dir` with the example plug-in (examples/plugins) copied to a folder outside the
repository: its registered workflow and its `module:object` reward function run in the explorer (their
metric is in metrics/explorer.jsonl). A plug-in module that imports where `rft run` runs but raises in
the explorer's process fails the run with that exception in the failure message."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.rft_run import ROOT, assert_no_orphans, env, example, jsonl, tiny_model, write_config

pytestmark = pytest.mark.slow
STEPS = 2


def _plugin_run(tmp_path: Path) -> tuple[Path, Path]:
    """The example plug-in folder copied outside the repository, and an explore-mode config for it."""
    plugins = tmp_path / "outside" / "plugins"
    shutil.copytree(ROOT / "examples" / "plugins", plugins)
    assert ROOT not in plugins.resolve().parents
    tree = example("plugins/plugin.yaml")
    del tree["plugin_dirs"]  # the folder comes from --plugin-dir
    tree["mode"] = "explore"
    tree["checkpoint_root_dir"] = str(tmp_path / "ckpt")
    tree["model"]["model_path"] = str(tiny_model())
    tree["buffer"]["total_steps"] = STEPS
    tree["buffer"]["explorer_input"]["taskset"]["path"] = str(plugins / "count_up.jsonl")
    return plugins, write_config(tmp_path / "run.yaml", tree)


def _rft_run(config: Path, plugins: Path) -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable,
        "-m",
        "launcher.cli",
        "run",
        "--config",
        str(config),
        "--plugin-dir",
        str(plugins),
    ]
    return subprocess.run(argv, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=200)


def test_a_plugin_outside_the_repository_runs_its_workflow_and_reward(tmp_path):
    plugins, config = _plugin_run(tmp_path)
    proc = _rft_run(config, plugins)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert_no_orphans(out)
    rows = [r for r in jsonl(tmp_path / "ckpt/plugins/count_up/metrics/explorer.jsonl") if "step" in r]
    assert [r["step"] for r in rows if "rollout/reward/mean" in r] == list(range(1, STEPS + 1))
    for row in rows:  # the plug-in's reward function's extra key, set by the plug-in's workflow
        if "rollout/reward/mean" in row:
            assert 0.0 <= row["rollout/count_up_distance/mean"] <= 10.0
            assert row["rollout/experience_count"] == 4 * 4  # batch_size x repeat_times


def test_a_plugin_failing_in_the_service_names_its_exception(tmp_path):
    plugins, config = _plugin_run(tmp_path)
    # imports in `rft run` (which checks every name first) and in the buffer; raises in the explorer
    (plugins / "scoring_client.py").write_text(
        "import sys\n"
        "if sys.argv[0].endswith('explorer/__main__.py'):\n"
        "    raise ConnectionError('scoring server 10.0.0.9:9000 refused the connection')\n"
    )
    proc = _rft_run(config, plugins)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failure = next(
        line for line in proc.stderr.splitlines() if line.startswith("rft run: the explorer failed")
    )
    assert "plug-in module 'scoring_client'" in failure
    assert "ConnectionError: scoring server 10.0.0.9:9000 refused the connection" in failure
    assert_no_orphans(proc.stdout + proc.stderr)
