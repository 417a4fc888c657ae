"""Checks `rft run` makes before it starts any process, so a run that cannot work fails at once with
a message saying what to do: the Redis server a `redis` buffer store needs answers, the monitor
backend's package is installed, the first stage's model folder exists."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from services.common.config import RFTConfig

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
            f"`pip install {pkg}` or set monitor.monitor_type: console"
        )


def check_model(path: str) -> None:
    if not path:
        raise PreflightError("model.model_path is not set")
    if not Path(path).expanduser().is_dir():
        raise PreflightError(
            f"model.model_path {path!r} is not a local folder; models are never downloaded at run time. "
            f"For the tiny model: `rft make-tiny-model {path}`"
        )


def preflight(stages: list[RFTConfig]) -> None:
    """Everything the stages need from outside; raises PreflightError."""
    urls = {c.services.buffer.redis_url for c in stages if c.services.buffer.store == "redis"}
    for url in sorted(urls):
        check_redis(url)
    for monitor_type in sorted({c.monitor.monitor_type for c in stages}):
        check_monitor(monitor_type)
    if stages:
        check_model(stages[0].model.model_path)
