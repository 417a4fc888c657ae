"""Services that cannot start fail at once and say why, with real child processes on the real service
skeleton (services/common/app.py): a plug-in folder whose module raises at import in the service (but
not in the launcher) ends the stage with that exception in `StageFailed`'s message; a build that
raises logs `failed to start` with the exception and exits 1; a service that asks to stop while it is
still starting (an auto-started run failing at once) exits with the code it asked for instead of
being killed by its own SIGTERM."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from launcher.processes import ServiceProcess, first_error
from launcher.supervisor import RestartPolicy, StageFailed, Supervisor

ROOT = Path(__file__).resolve().parents[3]
ENV = {"PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'protos'}", "PYTHONUNBUFFERED": "1"}


def _config(tmp_path: Path, **tree) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"log": {"format": "json"}, **tree}))
    return path


def _fake(tmp_path: Path, service: str, config: Path) -> ServiceProcess:
    port_file = tmp_path / "run" / f"{service}.port"
    return ServiceProcess(
        name=service,
        argv=[
            sys.executable,
            "-m",
            "tests.support.fake_service",
            service,
            "--config",
            str(config),
            "--port-file",
            str(port_file),
        ],  # fmt: skip
        log_file=tmp_path / "log" / f"{service}.log",
        port_file=port_file,
        env=dict(ENV),
        finishes_run=service == "explorer",
    )


async def test_a_plugin_that_fails_to_import_in_the_service_fails_the_stage_with_its_exception(tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    # importable where `rft run` runs, not in the service process (a dependency only one side has)
    (plugins / "start_fail_plugin.py").write_text(textwrap.dedent("""
        import sys
        if sys.argv[0].endswith("fake_service.py"):
            raise RuntimeError("no scoring server is reachable from this explorer")
    """))  # fmt: skip
    config = _config(tmp_path, plugin_dirs=["plugins"])
    explorer = _fake(tmp_path, "explorer", config)
    supervisor = Supervisor([[], [explorer]], "t", RestartPolicy(0), cwd=ROOT, ready_timeout_s=60)
    with pytest.raises(StageFailed) as err:
        await supervisor.run(asyncio.Event())
    await supervisor.shutdown()
    failure = err.value
    assert failure.service == "explorer"
    assert failure.message.startswith(
        "exited with code 2 before it was ready; its first error: PluginError: "
    )
    assert "plug-in module 'start_fail_plugin'" in failure.message
    assert "RuntimeError: no scoring server is reachable from this explorer" in failure.message
    assert "cannot load plug-ins" in failure.log_tail  # the structured log line, with its traceback


SERVICE = textwrap.dedent("""
    import asyncio, sys
    from services.common.app import service_main, stop_service

    async def build(config):
        if sys.argv[1] == "raise":
            raise ValueError("taskset 'math': workflow 'nope': unknown workflow")
        async def fail_at_once():
            stop_service(3)  # as the explorer's auto-started run does when its first step fails
        asyncio.get_running_loop().create_task(fail_at_once())
        return [], None

    sys.exit(service_main("explorer", build, sys.argv[2:]))
""")  # fmt: skip


@pytest.mark.parametrize(("mode", "code"), [("raise", 1), ("stop", 3)])
def test_a_service_failing_while_it_starts_exits_with_its_code_and_logs_why(tmp_path, mode, code):
    config = _config(tmp_path)
    log = tmp_path / "explorer.log"
    with log.open("wb") as fh:
        proc = subprocess.run(
            [sys.executable, "-c", SERVICE, mode, "--config", str(config)],
            stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **ENV}, cwd=ROOT, timeout=60,
        )  # fmt: skip
    assert proc.returncode == code, log.read_text()
    if mode == "raise":
        assert first_error(log) == "ValueError: taskset 'math': workflow 'nope': unknown workflow"
        assert '"event": "failed to start"' in log.read_text()


def test_rft_serve_passes_plugin_dirs_to_the_service(tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "serve_fail_plugin.py").write_text("raise ImportError('serve_fail_plugin needs scorer_sdk')\n")
    config = _config(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "serve", "buffer", "--config", str(config),
         "--plugin-dir", str(plugins)],
        capture_output=True, text=True, env={**os.environ, **ENV}, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "plug-in module 'serve_fail_plugin'" in proc.stderr
    assert "ImportError: serve_fail_plugin needs scorer_sdk" in proc.stderr
