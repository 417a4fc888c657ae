"""Checks `rft run` makes before it starts any process, so a run that cannot work fails at once with
a message saying what to do: the Redis server a `redis` buffer store needs answers, the monitor
backend's package is installed, the first stage's model folders and every stage's data and TLS files
exist, and TLS on names the CA the services verify each other with.

Relative paths are resolved against the current directory, as the services `rft run` starts (they
run in it) resolve them; `rft config check` runs the same path checks (`path_problems`) and the same
memory check (`memory_problems`: every placed GPU holds what the memory plan puts on it; `rft run`
plans with the size nvidia-smi reports, `rft config check` with `cluster.gpu_memory_gib`, and prints
each GPU's planned total with `memory_summary`)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from launcher.memory_plan import GIB, memory_plan
from services.common.config import RFTConfig
from services.common.config.gpus import gpu_demand, place_gpus

MONITOR_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


class PreflightError(RuntimeError):
    """The run cannot start; the message says why and what to do."""


def check_redis(url: str, timeout_s: float = 3.0) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise PreflightError(
            f"services.buffer.store is redis but {url} does not answer ({type(exc).__name__}: {exc}); "
            "start redis-server there (or set RFT_REDIS_URL), or use services.buffer.store: memory"
        ) from None
    finally:
        client.close()


def check_monitor(monitor_type: str) -> None:
    pkg = MONITOR_PACKAGES.get(monitor_type)
    if pkg and importlib.util.find_spec(pkg) is None:
        raise PreflightError(
            f"monitor.monitor_type is {monitor_type!r} but the {pkg!r} package is not installed; "
            f"`uv pip install --python {sys.executable} {pkg}` or set monitor.monitor_type: console"
        )


def check_model(path: str, key: str = "model.model_path") -> None:
    if not path:
        raise PreflightError(f"{key} is not set")
    if not Path(path).expanduser().is_dir():
        raise PreflightError(
            f"{key} {path!r}{_relative(path)} is not a local folder; models are never downloaded at run time. "
            f"For the tiny model: `rft make-tiny-model {path}`"
        )


def _relative(path: str) -> str:
    p = Path(path).expanduser()
    return "" if p.is_absolute() else f" (relative to the current directory, {Path.cwd()})"


def _data_paths(config: RFTConfig) -> list[tuple[str, str]]:
    ei, ti = config.buffer.explorer_input, config.buffer.trainer_input
    out = [("buffer.explorer_input.taskset.path", ei.taskset.path)] if ei.taskset is not None else []
    out += [(f"buffer.explorer_input.tasksets[{i}].path", t.path) for i, t in enumerate(ei.tasksets)]
    out += [
        (f"buffer.explorer_input.eval_tasksets[{i}].path", t.path) for i, t in enumerate(ei.eval_tasksets)
    ]
    if ti.experience_buffer.path:
        out.append(("buffer.trainer_input.experience_buffer.path", ti.experience_buffer.path))
    return out


def _tls_paths(config: RFTConfig) -> list[tuple[str, str]]:
    tls = config.services.tls
    keys = ("cert_file", "key_file", "ca_file", "client_cert_file", "client_key_file")
    return [(f"services.tls.{key}", getattr(tls, key)) for key in keys if getattr(tls, key)]


def tls_problems(config: RFTConfig) -> list[str]:
    """What keeps `rft run`'s services from talking TLS to each other: they dial 127.0.0.1 and check
    the servers' certificate against `ca_file`, so TLS on needs it."""
    tls = config.services.tls
    if tls.enabled and not tls.ca_file:
        return [
            "services.tls.cert_file is set but services.tls.ca_file is not: the services `rft run` starts "
            "dial each other at 127.0.0.1 and verify the certificate with ca_file; set services.tls.ca_file "
            "(the CA that signed cert_file, or cert_file itself when it is self-signed)"
        ]
    return []


def path_problems(stages: list[RFTConfig]) -> list[str]:
    """Every local path the stages read that is not there: the first stage's model folders (later
    stages start from the previous stage's export) and every stage's tasksets and SFT data."""
    problems = []
    if stages:
        first = stages[0]
        models = [("model.model_path", first.model.model_path)]
        if first.model.critic_model_path:
            models.append(("model.critic_model_path", first.model.critic_model_path))
        if first.explorer.rollout_model.model_path and first.mode != "train":
            models.append(("explorer.rollout_model.model_path", first.explorer.rollout_model.model_path))
        for i, m in enumerate(first.explorer.auxiliary_models):
            if m.model_path and not m.api_base and first.mode != "train":
                models.append((f"explorer.auxiliary_models[{i}].model_path", m.model_path))
        for key, path in models:
            try:
                check_model(path, key)
            except PreflightError as exc:
                problems.append(str(exc))
    for n, config in enumerate(stages):
        label = f"stage {n}: " if len(stages) > 1 else ""
        for key, path in _data_paths(config):
            if key.startswith("buffer.explorer_input") and config.mode == "train":
                continue
            if path and not Path(path).expanduser().exists():
                problems.append(f"{label}{key} {path!r}{_relative(path)} does not exist")
        for key, path in _tls_paths(config):
            if not Path(path).expanduser().is_file():
                problems.append(f"{label}{key} {path!r}{_relative(path)} is not a file")
    return sorted(set(problems), key=problems.index)


def _plans(stages: list[RFTConfig], capacity_gib: float | None, explorers: int):
    """(label, memory plan) of every stage, on the placement `rft run` makes."""
    for n, config in enumerate(stages):
        label = f"stage {n}: " if len(stages) > 1 else ""
        c = config.cluster
        placement = place_gpus(
            c.node_num * c.gpu_per_node,
            gpu_demand(config),
            mode=config.mode,
            explorers=explorers,
            colocate=c.colocate,
        )
        yield label, memory_plan(config, capacity_gib, placement)


def memory_problems(
    stages: list[RFTConfig], capacity_gib: float | None = None, explorers: int = 1
) -> list[str]:
    """Every placed GPU of every stage whose planned bytes exceed its memory (memory_plan.py), with
    the numbers and the fixes. Nothing for `gpu_per_node: 0` or a model with no local config.json."""
    problems = [label + p for label, plan in _plans(stages, capacity_gib, explorers) for p in plan.problems()]
    return sorted(set(problems), key=problems.index)


def memory_summary(
    stages: list[RFTConfig], capacity_gib: float | None = None, explorers: int = 1
) -> list[str]:
    """One line per stage: the plan's total on each placed GPU against the GPU's memory, or why there
    is no plan (no local config.json, no GPUs placed)."""
    lines = []
    for label, plan in _plans(stages, capacity_gib, explorers):
        if not plan.columns or not plan.placed:
            lines.append(f"{label}memory plan: " + "; ".join(plan.notes or ["nothing placed"]))
            continue
        totals = ", ".join(f"{gpu} {plan.total(gpu) / GIB:.1f}" for gpu in plan.columns)
        verdict = "does not fit" if plan.problems() else "fits"
        lines.append(
            f"{label}memory plan: {totals} GiB of {plan.capacity_bytes / GIB:.1f} GiB per GPU "
            f"({plan.capacity_from}): {verdict}"
        )
    return lines


def preflight(stages: list[RFTConfig]) -> None:
    """Everything the stages need from outside; raises PreflightError."""
    urls = {c.services.buffer.redis_url for c in stages if c.services.buffer.store == "redis"}
    for url in sorted(urls):
        check_redis(url)
    for monitor_type in sorted({c.monitor.monitor_type for c in stages}):
        check_monitor(monitor_type)
    problems = path_problems(stages) + [p for c in stages[:1] for p in tls_problems(c)]
    if problems:
        raise PreflightError("; ".join(problems))
