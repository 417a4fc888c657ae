"""What a run starts: its stages (Trinity-RFT `stages`, each a full config of its own) and, for each
stage, the service processes its `mode` needs, in start order.

    both     synchronizer + buffer, then trainer + explorer(s)
    train    buffer, then trainer (+ the offline-data feeder when the experience buffer has a `path`)
    explore  buffer, then explorer(s)
    bench    explorer (bench mode: evaluates the base model and every checkpoint)
    serve    as both; the explorer serves an OpenAI-compatible endpoint instead of reading tasksets

Every process reads the same effective config, written to `<job_dir>/config.yaml`: the stage's tree
with the launcher's choices applied (loopback hosts, port 0, `auto_start` on) and no secret in it
(the bearer token travels as `RFT_AUTH_TOKEN`). Where each peer listens reaches the later processes
as `RFT_<SERVICE>_ADDRESS`, as in the compose stack.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from services.common.config import RFTConfig, resolve, validate_tree
from services.common.config.loader import ENV_OVERRIDES, dump_tree, stage_tree
from services.common.config.services import SERVICE_NAMES

# (first wave, second wave): the first wave must be healthy before the second starts
WAVES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "both": (("synchronizer", "buffer"), ("trainer", "explorer")),
    "train": (("buffer",), ("trainer",)),
    "explore": (("buffer",), ("explorer",)),
    "bench": ((), ("explorer",)),
    "serve": (("synchronizer", "buffer"), ("trainer", "explorer")),  # the explorer serves HTTP
}


@dataclass(frozen=True)
class Stage:
    """One stage of a run: its name ('' for a run without stages) and its validated config."""

    name: str
    config: RFTConfig

    @property
    def job_dir(self) -> Path:
        return resolve(self.config).job_dir


def _stage_trees(config: RFTConfig) -> list[tuple[str, dict[str, Any]]]:
    base = dump_tree(config)  # the keys resolved.py derives when unset stay unset
    if not config.stages:
        return [("", base)]
    return [
        (stage.stage_name, stage_tree(base, stage.model_dump(mode="json", exclude_none=True)))
        for stage in config.stages
    ]


def run_stages(config: RFTConfig) -> list[Stage]:
    """The stages of a run, each validated (model paths are set later, from the previous export)."""
    return [Stage(name, validate_tree(tree, f"stage {name!r}" if name else "<run>"))
            for name, tree in _stage_trees(config)]  # fmt: skip


def effective_tree(stage: Stage, model_path: str | None, multi_stage: bool) -> dict[str, Any]:
    """The config every process of `stage` reads."""
    tree = dump_tree(stage.config)
    tree["stages"] = []
    if model_path:
        tree["model"]["model_path"] = model_path
    for svc in SERVICE_NAMES:
        ep = tree["services"][svc]
        ep["host"], ep["port"], ep["address"] = "127.0.0.1", 0, ""
        if ep["metrics_port"] > 0:  # several services on one host: any free port
            ep["metrics_port"] = 0
    tree["services"]["auth_token"] = None
    if multi_stage and tree["services"]["buffer"]["store"] == "redis":
        # stages share a Redis server, never a stream
        tree["services"]["buffer"]["stream_prefix"] += f":{stage.name}"
    tree["explorer"]["auto_start"] = True
    tree["trainer"]["auto_start"] = True
    return tree


def write_config(tree: Mapping[str, Any], job_dir: Path) -> Path:
    job_dir.mkdir(parents=True, exist_ok=True)
    path = job_dir / "config.yaml"
    tmp = path.with_suffix(".tmp")
    tmp.write_text("# written by `rft run`: the config every process of this run reads\n"
                   + yaml.safe_dump(dict(tree), sort_keys=False))  # fmt: skip
    tmp.replace(path)
    return path


def child_env(environ: Mapping[str, str], auth_token: str | None) -> dict[str, str]:
    """The environment of a child: the user's, minus address/port overrides (the launcher owns
    those), plus the token and unbuffered output so logs are current."""
    env = {k: v for k, v in environ.items() if not (k in ENV_OVERRIDES and k.startswith(_ADDRESS_VARS))}
    env.pop("RFT_EXPLORER_ID", None)
    env.pop("RFT_EXPLORER_SHARD", None)
    if auth_token:
        env["RFT_AUTH_TOKEN"] = auth_token
    env["PYTHONUNBUFFERED"] = "1"
    # several processes share the cores: one BLAS/OpenMP thread each unless the user said otherwise
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 2) // 4)))
    return env


_ADDRESS_VARS = tuple(f"RFT_{s.upper()}_" for s in SERVICE_NAMES)


def service_argv(service: str, config_file: Path, port_file: Path, nproc: int = 1) -> list[str]:
    if service == "trainer" and nproc > 1:
        head = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    else:
        head = [sys.executable]
    return [*head, "-m", f"services.{service}", "--config", str(config_file), "--port-file", str(port_file)]
