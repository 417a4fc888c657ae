"""The `rft` command: run a whole run, make a local tiny model, check and show configs, serve a service."""

from __future__ import annotations

import importlib.util
import runpy
import sys
from pathlib import Path
from typing import Annotated

import typer
import yaml

from services.common.config import ConfigError, load_config, resolve
from services.common.config.loader import dump_tree

SERVICES = ("buffer", "explorer", "trainer", "synchronizer")

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="RFT Mesh: reinforcement fine-tuning as services."
)
config_app = typer.Typer(no_args_is_help=True, help="Validate or print a run config.")
app.add_typer(config_app, name="config")

SetOpt = Annotated[list[str] | None, typer.Option("--set", help="override a key: section.key=value")]
PluginOpt = Annotated[
    list[str] | None,
    typer.Option("--plugin-dir", help="a folder of plug-in modules (repeatable; adds to plugin_dirs)"),
]


def _load(path: Path, overrides: list[str] | None):
    try:
        return load_config(path, overrides=overrides or [])
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None


def _check_names(file: Path, config, plugin_dirs: list[str] | None):
    """`config` with absolute plugin_dirs; exit 2 listing every name that does not resolve."""
    from launcher.names import check_config

    config, problems = check_config(config, file, plugin_dirs or [])
    if problems:
        typer.echo(str(ConfigError(str(file), problems)), err=True)
        raise typer.Exit(2)
    return config


def _warn(config) -> None:
    """Keys that load but have no effect here (services/common/config/compat.py), one line each."""
    from services.common.config.loader import config_warnings

    for line in config_warnings(config):
        typer.echo(f"warning: {line}", err=True)


@config_app.command("check")
def config_check(
    file: Path,
    set_: SetOpt = None,
    skip_paths: Annotated[
        bool, typer.Option("--skip-paths", help="skip the local path checks (a config for another machine)")
    ] = False,
    plugin_dir: PluginOpt = None,
) -> None:
    """Validate FILE; exit 2 with the bad path, value and a suggestion when it is wrong. The model
    folders and data files must exist, relative to the current directory, as `rft run` checks, and
    the memory plan must fit the GPUs (cluster.gpu_memory_gib each); it prints the plan's total per
    GPU (`rft config show` prints every term)."""
    from launcher.preflight import memory_problems, memory_summary, path_problems
    from launcher.stages import run_stages

    config = _load(file, set_)
    r = resolve(config)
    _warn(config)
    config = _check_names(file, config, plugin_dir)  # every registry name and plug-in resolves
    stages = [s.config for s in run_stages(config)]
    problems = [] if skip_paths else path_problems(stages)
    if problems:
        typer.echo(
            f"{file}: paths `rft run` would refuse:\n" + "\n".join(f"  {p}" for p in problems), err=True
        )
        raise typer.Exit(2)
    too_big = memory_problems(stages)
    if too_big:
        typer.echo(
            f"{file}: the GPUs cannot hold this run (memory plan; `rft config show` prints it):\n"
            + "\n".join(f"  {p}" for p in too_big),
            err=True,
        )
        raise typer.Exit(2)
    typer.echo(
        f"{file}: ok (mode={config.mode}, algorithm={config.algorithm.algorithm_type}, "
        f"batch_size={config.buffer.batch_size}, train_batch_size={r.train_batch_size}, "
        f"sync={config.synchronizer.sync_method}/{config.synchronizer.sync_style})"
    )
    for line in memory_summary(stages):
        typer.echo(f"{file}: {line}")


@config_app.command("show")
def config_show(file: Path, set_: SetOpt = None, plugin_dir: PluginOpt = None) -> None:
    """Print the full config with every default filled in (plugin_dirs absolute), then the derived
    values, then the memory plan: GiB per component per GPU of the placement."""
    from launcher.memory_plan import memory_plan
    from services.common.plugins import resolve_plugin_dirs

    config = _load(file, set_)
    config = config.model_copy(
        update={"plugin_dirs": resolve_plugin_dirs(config.plugin_dirs, file, plugin_dir or [])}
    )
    r = resolve(config)
    _warn(config)
    derived = {
        "train_batch_size": r.train_batch_size,
        "experiences_per_explore_step": r.experiences_per_explore_step,
        "max_prompt_tokens": r.max_prompt_tokens,
        "max_response_tokens": r.max_response_tokens,
        "max_model_len": r.max_model_len,
        "max_token_len_per_gpu": r.max_token_len_per_gpu,
        "max_staleness": r.max_staleness,
        "gpu_split": r.gpu_split,
        "gpu_placement": {
            "explorer": list(r.gpu_placement.explorers[0]) if r.gpu_placement.explorers else [],
            "trainer": list(r.gpu_placement.trainer),
            "shared": r.shared_gpu,
            "colocated": r.gpu_placement.colocated,
        },
        "rollout_gpu_memory_utilization": r.rollout_gpu_memory_utilization,
        "trainer_gpu_memory_fraction": r.trainer_gpu_memory_fraction,
        "weight_sync_backend": r.weight_sync_backend,
        "job_dir": str(r.job_dir),
        "explorer_run_name": r.explorer_run_name,
        "trainer_run_name": r.trainer_run_name,
    }
    typer.echo(yaml.safe_dump(dump_tree(config), sort_keys=False), nl=False)  # loads back as it resolves
    typer.echo(yaml.safe_dump({"resolved": derived}, sort_keys=False), nl=False)
    plan = memory_plan(config)
    typer.echo("# memory plan (GiB per GPU; launcher/memory_plan.py)")
    typer.echo("\n".join(f"# {line}" for line in plan.table().splitlines()))
    for problem in plan.problems():
        typer.echo(f"# does not fit: {problem}")


@app.command("run")
def run_cmd(
    config: Annotated[Path, typer.Option("--config", "-c", help="run config YAML")],
    set_: SetOpt = None,
    explorers: Annotated[int, typer.Option(help="explorer processes (each reads shard i/n)")] = 1,
    plugin_dir: PluginOpt = None,
) -> None:
    """Run CONFIG end to end as local processes: progress, then a summary and the checkpoint path.

    Exit 0 finished, 1 a service failed (named, with its first error and last log lines), 2 bad config,
    130 stopped by Ctrl-C (run it again to continue from the checkpoints)."""
    from launcher import run

    raise typer.Exit(run(config, set_ or [], explorers=explorers, plugin_dirs=plugin_dir or []))


@app.command("audit")
def audit_cmd(
    job_dir: Path,
    redis_url: Annotated[
        str | None, typer.Option(help="the buffer's Redis (default: from JOB_DIR/config.yaml)")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Compare what the buffer accepted with the lineage of JOB_DIR's last checkpoint: produced, trained
    once, trained twice, lost, remaining. Exit 0 when nothing is lost or trained twice, 1 otherwise."""
    import json

    from launcher.audit import audit_job

    if not job_dir.is_dir():
        typer.echo(f"{job_dir}: no such job folder", err=True)
        raise typer.Exit(2)
    result = audit_job(job_dir, redis_url)
    if json_out:
        typer.echo(json.dumps(result.as_dict()))
    else:
        for key, value in result.as_dict().items():
            typer.echo(f"{key:>14}: {'unknown (memory store)' if value is None else value}")
    raise typer.Exit(0 if result.ok else 1)


@app.command("replay")
def replay_cmd(
    job_dir: Path,
    step: Annotated[list[int], typer.Option("--step", "-s", help="the trainer step to replay (repeatable)")],
    tolerance: Annotated[
        float | None,
        typer.Option(help="relative tolerance (default: 0, bit for bit, on the CPU; 1e-3 on a GPU)"),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object per step")] = False,
) -> None:
    """Train step N of JOB_DIR again from the checkpoint before it, on the batch its lineage names, and
    compare the weights and metrics with what the run recorded (docs/replay.md). Needs the run's replay
    records (trainer.replay_keep_steps). Exit 0 every step matches, 1 one differs, 2 it cannot be replayed
    (past retention, no saved state before it, a multi-rank run)."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "services.trainer.replay", str(job_dir)]
    argv += [f"--step={s}" for s in step]
    argv += [f"--tolerance={tolerance}"] if tolerance is not None else []
    argv += ["--json"] if json_out else []
    raise typer.Exit(subprocess.run(argv).returncode)  # the trainer's code, in a process of its own


@app.command("plot")
def plot_cmd(
    job_dir: Path,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="PNG to write")] = None,
) -> None:
    """Draw JOB_DIR's curves (reward, response length, losses, KL, entropy, grad norm, throughput per
    step; one line per explorer; stages one after another) from its metrics/*.jsonl into a PNG
    (default JOB_DIR/curves.png)."""
    from launcher.plot import PlotError, plot_job

    try:
        path = plot_job(job_dir, out)
    except PlotError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    typer.echo(f"plot: {path}")


@app.command("top")
def top_cmd(
    target: Annotated[
        Path | None, typer.Argument(help="job folder of `rft run`, or a run config (compose: its services.*)")
    ] = None,
    interval: Annotated[float, typer.Option(help="seconds between frames")] = 2.0,
    once: Annotated[bool, typer.Option("--once", help="print one frame and exit")] = False,
    buffer: Annotated[list[str] | None, typer.Option(help="the buffer's HOST:PORT")] = None,
    trainer: Annotated[list[str] | None, typer.Option(help="the trainer's HOST:PORT")] = None,
    synchronizer: Annotated[list[str] | None, typer.Option(help="the synchronizer's HOST:PORT")] = None,
    explorer: Annotated[list[str] | None, typer.Option(help="an explorer's HOST:PORT (repeatable)")] = None,
    auth_token: Annotated[
        str | None, typer.Option(help="bearer token (default: the config's, or RFT_AUTH_TOKEN)")
    ] = None,
) -> None:
    """A live view of a running job from its services' own endpoints: each service's state, step,
    restarts and how long since it moved; explorers' held version and rollout rate; buffer depth; the
    trainer's step time, tokens/s and loss; the last syncs; the reward curve. Exit 2: nothing to watch."""
    from launcher.top.targets import TargetError, find_targets
    from launcher.top.view import watch

    flags = {"buffer": buffer, "trainer": trainer, "synchronizer": synchronizer, "explorer": explorer}
    try:
        targets = find_targets(target, {k: v or [] for k, v in flags.items()}, auth_token)
    except TargetError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    watch(targets, interval_s=max(0.2, interval), once=once)


@app.command("convert-verl")
def convert_verl_cmd(
    script: Annotated[str, typer.Argument(help="file with a veRL script or command; - reads stdin")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="YAML to write (default stdout)")] = None,
) -> None:
    """Convert a veRL `main_ppo` script into a run config; keys with no equivalent become comments and
    warnings. Several commands give OUT, OUT-2, ... Exit 2 when SCRIPT holds no veRL command."""
    from launcher.convert_verl.cli import convert_verl_main

    raise typer.Exit(convert_verl_main(script, out))


conformance_app = typer.Typer(no_args_is_help=True, help="Check a server against its .proto contract.")
app.add_typer(conformance_app, name="conformance")


@conformance_app.command("buffer")
def conformance_buffer(
    address: Annotated[str, typer.Argument(help="the BufferService, host:port")],
    auth_token: Annotated[str | None, typer.Option(help="bearer token, when the server has auth on")] = None,
    group: Annotated[str, typer.Option(help="a consumer group the server declares, for the suite only")] = (
        "conformance"
    ),
) -> None:
    """Run the buffer contract suite (launcher/conformance) against ADDRESS: one PASS/FAIL/SKIP line per
    guarantee of buffer.proto. Exit 0 all passed, 1 a check failed, 2 usage (e.g. GROUP not declared)."""
    import asyncio

    from launcher.conformance.buffer import run_buffer_suite

    raise typer.Exit(asyncio.run(run_buffer_suite(address, auth_token, group)))


@conformance_app.command("synchronizer")
def conformance_synchronizer(
    address: Annotated[str, typer.Argument(help="the SynchronizerService, host:port")],
    auth_token: Annotated[str | None, typer.Option(help="bearer token, when the server has auth on")] = None,
) -> None:
    """Run the synchronizer contract suite against ADDRESS, a synchronizer no run uses (it registers a
    trainer and publishes versions): one PASS/FAIL/SKIP line per guarantee of synchronizer.proto. Exit 0 all
    passed, 1 a check failed, 2 usage (e.g. the synchronizer has live members)."""
    import asyncio

    from launcher.conformance.synchronizer import run_synchronizer_suite

    raise typer.Exit(asyncio.run(run_synchronizer_suite(address, auth_token)))


@conformance_app.command("explorer")
def conformance_explorer(
    address: Annotated[str, typer.Argument(help="the ExplorerService, host:port")],
    auth_token: Annotated[str | None, typer.Option(help="bearer token, when the server has auth on")] = None,
    drive: Annotated[
        bool,
        typer.Option(help="also run explore/eval steps and weight-group calls (an explorer of your own)"),
    ] = False,
) -> None:
    """Run the explorer contract suite against ADDRESS: one PASS/FAIL/SKIP line per guarantee of
    explorer.proto. Without --drive only checks that change nothing run. Exit 0 all passed, 1 a check
    failed, 2 usage (e.g. a token needed)."""
    import asyncio

    from launcher.conformance.explorer import run_explorer_suite

    raise typer.Exit(asyncio.run(run_explorer_suite(address, auth_token, drive)))


@app.command("make-tiny-model")
def make_tiny_model_cmd(
    out_dir: Path,
    size: Annotated[str, typer.Option(help="tiny (~1M params) or small (~10M)")] = "tiny",
    seed: int = 0,
    force: Annotated[bool, typer.Option(help="overwrite an existing model folder")] = False,
) -> None:
    """Write a real HF model folder (small Qwen2, random weights, locally trained tokenizer) to OUT_DIR."""
    from launcher.tiny_model import SIZES, make_tiny_model

    if size not in SIZES:
        typer.echo(f"--size {size!r} is not one of {', '.join(SIZES)}", err=True)
        raise typer.Exit(2)
    if (out_dir / "config.json").exists() and not force:
        typer.echo(f"{out_dir} already holds a model; pass --force to overwrite")
        return
    make_tiny_model(out_dir, size=size, seed=seed)
    typer.echo(f"wrote {size} model to {out_dir}")


@app.command("serve")
def serve(
    service: Annotated[str, typer.Argument(help=f"which service: {', '.join(SERVICES)}, or tinker")],
    config: Annotated[Path | None, typer.Option("--config", "-c", help="run config YAML")] = None,
    set_: SetOpt = None,
    port: Annotated[
        int | None, typer.Option(help="listen port (default services.<service>.port; 0 = a free port)")
    ] = None,
    port_file: Annotated[
        Path | None, typer.Option(help="write the bound port to this file once serving")
    ] = None,
    plugin_dir: PluginOpt = None,
    explorer_id: Annotated[
        str | None, typer.Option(help="explorer only: its id (default RFT_EXPLORER_ID or explorer.name)")
    ] = None,
    shard: Annotated[
        str | None, typer.Option(help="explorer only: take taskset rows i mod n, as i/n (default 0/1)")
    ] = None,
    host: Annotated[str, typer.Option(help="tinker only: the address to listen on")] = "127.0.0.1",
    api_key: Annotated[str | None, typer.Option(help="tinker only: the key clients send (tml-...)")] = None,
    synchronizer: Annotated[
        str | None, typer.Option(help="tinker only: HOST:PORT of a run's synchronizer (with --explorer)")
    ] = None,
    explorer: Annotated[
        str | None, typer.Option(help="tinker only: URL of that run's explorer in mode serve (.../v1)")
    ] = None,
) -> None:
    """Run one service: `rft serve buffer --config run.yaml` (same as `python -m services.buffer`).

    It stops on SIGTERM/SIGINT (the trainer saves its last trained step first); exit 0 done, 1 failed,
    2 bad config or plug-in. `rft serve tinker [--port --host --api-key]` serves the Tinker API
    (docs/tinker.md); it needs no config. With `--synchronizer HOST:PORT --explorer URL` its saves
    for the sampler are published as that run's versions and sampled from that explorer."""
    if service == "tinker":
        argv = ["--host", host, "--port", str(8000 if port is None else port)]
        argv += ["--api-key", api_key] if api_key else []
        argv += ["--synchronizer", synchronizer] if synchronizer else []
        argv += ["--explorer", explorer] if explorer else []
        argv += ["--port-file", str(port_file)] if port_file is not None else []
        sys.argv = ["rft serve tinker", *argv]
        runpy.run_module("tinker_api", run_name="__main__", alter_sys=True)  # as the services are run
        return
    if service not in SERVICES:
        typer.echo(f"unknown service {service!r}; choose one of {', '.join(SERVICES)} or tinker", err=True)
        raise typer.Exit(2)
    if config is None:
        typer.echo(
            f"rft serve {service} needs --config RUN.yaml (only `rft serve tinker` runs without one)",
            err=True,
        )
        raise typer.Exit(2)
    if service != "explorer" and (explorer_id is not None or shard is not None):
        typer.echo("--explorer-id and --shard apply to the explorer only", err=True)
        raise typer.Exit(2)
    module = f"services.{service}.__main__"
    if importlib.util.find_spec(module) is None:
        typer.echo(f"the {service} service has no server in this version yet ({module} is missing)", err=True)
        raise typer.Exit(2)
    argv = ["--config", str(config)]
    argv += [arg for item in set_ or [] for arg in ("--set", item)]
    argv += ["--port", str(port)] if port is not None else []
    argv += ["--port-file", str(port_file)] if port_file is not None else []
    argv += [arg for d in plugin_dir or [] for arg in ("--plugin-dir", str(Path(d).resolve()))]
    argv += ["--explorer-id", explorer_id] if explorer_id is not None else []
    argv += ["--shard", shard] if shard is not None else []
    sys.argv = [f"rft serve {service}", *argv]
    runpy.run_module(f"services.{service}", run_name="__main__", alter_sys=True)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
