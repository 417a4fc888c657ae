"""`python -m tinker_api` (= `rft serve tinker`): serve the Tinker API with uvicorn.

With no `--base-model NAME=FOLDER`, base model `tiny` is `models/tiny` (built with the tiny-model
helper when missing). `--port 0` binds a free port; `--port-file` receives the bound port.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import torch
import uvicorn

from services.common.tiny_model import make_tiny_model

from .app import build_app
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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="rft serve tinker", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--port-file", type=Path)
    p.add_argument("--api-key", default=None, help="the key clients must send (TINKER_API_KEY); tml-...")
    p.add_argument("--base-model", action="append", default=[], help="NAME=FOLDER, repeatable")
    p.add_argument("--full", action="append", default=[], help="a base model NAME trained in full, not LoRA")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--checkpoint-dir", type=Path, default=Path("checkpoints/tinker"))
    a = p.parse_args(argv)
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    server = TinkerServer(base_models(a.base_model), a.checkpoint_dir, a.api_key, full=frozenset(a.full))
    asyncio.run(serve(server, a.host, a.port, a.port_file))


if __name__ == "__main__":
    main()
