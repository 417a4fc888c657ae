"""`python -m tinker_api` (= `rft serve tinker`): serve the Tinker API with uvicorn.

With no `--base-model NAME=FOLDER`, base model `tiny` is `models/tiny` (built with the tiny-model
helper when missing). `--port 0` binds a free port; `--port-file` receives the bound port.
With `--synchronizer HOST:PORT --explorer URL` (the service-backed mode, docs/tinker.md), saves for
the sampler of the explorer's base model (`--explorer-model`) are published as the run's versions
and sampled from that explorer in mode serve (explorer_sampler.py); without them all runs in process.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

import torch
import uvicorn

from launcher.tiny_model import make_tiny_model

from .app import build_app
from .sampling import Sampler
from .server import TinkerServer

TINY = Path("models/tiny")


def base_models(items: list[str]) -> dict[str, str]:
    if not items:
        if not (TINY / "config.json").is_file():
            make_tiny_model(TINY)
        return {"tiny": str(TINY.resolve())}
    out = {}
    for item in items:
        name, sep, folder = item.partition("=")
        if not sep or not (Path(folder) / "config.json").is_file():
            raise SystemExit(f"--base-model {item!r}: expected NAME=FOLDER with a model folder (config.json)")
        out[name] = str(Path(folder).resolve())
    return out


async def serve(server: TinkerServer, host: str, port: int, port_file: Path | None) -> None:
    config = uvicorn.Config(build_app(server), host=host, port=port, log_level="warning")
    userver = uvicorn.Server(config)
    task = asyncio.create_task(userver.serve())
    while not userver.started and not task.done():
        await asyncio.sleep(0.05)  # ok-sleep: uvicorn exposes no startup event
    if userver.started:
        bound = userver.servers[0].sockets[0].getsockname()[1]
        print(f"rft serve tinker: listening on http://{host}:{bound}", flush=True)
        if port_file is not None:
            port_file.write_text(str(bound))
    await task


def parser() -> argparse.ArgumentParser:
    """The command line of `python -m tinker_api` (deploy/docker-compose.tinker.yml runs it)."""
    p = argparse.ArgumentParser(prog="rft serve tinker", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--port-file", type=Path)
    p.add_argument("--api-key", default=None, help="the key clients must send (TINKER_API_KEY); tml-...")
    p.add_argument("--base-model", action="append", default=[], help="NAME=FOLDER, repeatable")
    p.add_argument("--full", action="append", default=[], help="a base model NAME trained in full, not LoRA")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--checkpoint-dir", type=Path, default=Path("checkpoints/tinker"))
    g = p.add_argument_group("service-backed mode (both or neither)")
    g.add_argument(
        "--synchronizer", help="HOST:PORT of the run's synchronizer: saves for the sampler publish"
    )
    g.add_argument("--explorer", help="URL of an explorer in mode serve (http://host:port/v1): sampling")
    g.add_argument(
        "--explorer-model", help="the served base model NAME the explorer runs (default: the only one)"
    )
    g.add_argument("--sync-dir", type=Path, help="checkpoint sync_method: where versions are written "
                   "(a folder the explorer reads; default <checkpoint-dir>/state_dicts)")  # fmt: skip
    g.add_argument("--auth-token", default=os.environ.get("RFT_AUTH_TOKEN"),
                   help="the services' token (services.auth_token; default RFT_AUTH_TOKEN)")  # fmt: skip
    g.add_argument("--member-id", default="tinker", help="this server's trainer id at the synchronizer")
    g.add_argument("--explorer-wait", type=float, default=120.0,
                   help="seconds a sample waits for the explorer to hold its version")  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> None:
    a = parser().parse_args(argv)
    if bool(a.synchronizer) != bool(a.explorer):
        raise SystemExit(
            "--synchronizer and --explorer go together: publish to the one, sample from the other"
        )
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    models = base_models(a.base_model)
    sampler = service_sampler(a, models)
    server = TinkerServer(models, a.checkpoint_dir, a.api_key, full=frozenset(a.full), sampler=sampler)
    try:
        asyncio.run(serve(server, a.host, a.port, a.port_file))
    finally:
        close = getattr(sampler, "close", None)
        if close is not None:
            close()


def service_sampler(a: argparse.Namespace, models: dict[str, str]) -> Sampler | None:
    """The explorer-backed sampler of `--synchronizer` and `--explorer` (None: neither given)."""
    if not a.synchronizer and not a.explorer:
        return None
    name = a.explorer_model or (next(iter(models)) if len(models) == 1 else None)
    if name not in models:
        raise SystemExit(
            f"--explorer-model {name!r}: name the base model the explorer runs, one of {', '.join(models)}"
        )
    from .explorer_sampler import ExplorerSampler
    from .publish import Publisher, PublishError

    try:
        publisher = Publisher(
            a.synchronizer, a.sync_dir or a.checkpoint_dir / "state_dicts", auth_token=a.auth_token,
            member_id=a.member_id,
        )  # fmt: skip
    except PublishError as exc:
        raise SystemExit(str(exc)) from exc
    return ExplorerSampler(
        publisher, a.explorer, models[name], auth_token=a.auth_token, wait_s=a.explorer_wait
    )


if __name__ == "__main__":
    main()
