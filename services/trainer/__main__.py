"""`python -m services.trainer --config X.yaml` (also `rft serve trainer`), or under
`torchrun --nproc_per_node N -m services.trainer --config X.yaml`: rank 0 serves gRPC, the other
ranks follow rank 0's commands.

Started outside torchrun with `trainer.nproc` N > 1, it replaces itself (same pid, same arguments)
with `torchrun --standalone --nproc_per_node N`, so one command serves every deployment: a compose
service, a k8s pod (its GPUs are cuda:0..N-1) or a shell. With `trainer.nnodes` M > 1 every node runs
that same command and torchrun meets the other nodes at node 0 (`services/trainer/nodes.py`: the node
rank and node 0's address come from the environment)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from services.common.app import load_service_plugins, parse_args, service_main
from services.common.config import ConfigError, load_config
from services.common.log import configure_logging
from services.common.plugins import PluginError
from services.trainer.distributed import exit_rank
from services.trainer.nodes import NodeError, NodePlace, node_place
from services.trainer.service import build, run_worker_rank


def torchrun_command(nproc: int, argv: Sequence[str], place: NodePlace | None = None) -> list[str] | None:
    """The command that runs this trainer as `nproc` torchrun ranks (on this node of `place`, when the
    trainer spans nodes); None for a single process on a single node."""
    if nproc <= 1 and place is None:
        return None
    rendezvous = place.torchrun_args() if place is not None else ["--standalone"]
    head = [sys.executable, "-m", "torch.distributed.run", *rendezvous, f"--nproc_per_node={nproc}"]
    return [*head, "-m", "services.trainer", *argv]


def _trainer_shape(argv: Sequence[str]) -> tuple[int, int]:
    """(trainer.nproc, trainer.nnodes) of the config ((1, 1) when there is none or it does not load:
    service_main says why)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--config")
    parser.add_argument("--set", action="append", default=[])
    args, _ = parser.parse_known_args(argv)
    if not args.config:
        return 1, 1
    try:
        trainer = load_config(args.config, overrides=args.set).trainer
    except ConfigError:
        return 1, 1
    return trainer.nproc, trainer.nnodes


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "RANK" not in os.environ:  # not a torchrun rank: become torchrun when the config asks for ranks
        nproc, nnodes = _trainer_shape(argv)
        try:
            place = node_place(nnodes) if nnodes > 1 else None
        except NodeError as exc:
            print(f"trainer: {exc}", file=sys.stderr)
            return 2
        command = torchrun_command(nproc, argv, place)
        if command is not None:
            sys.stdout.flush()
            os.execv(command[0], command)
    if int(os.environ.get("RANK", "0")) == 0:
        code = service_main("trainer", build, argv)
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            exit_rank(code)  # rank 0 of a group too: no teardown of sharded parameters at finalization
        return code
    args = parse_args("trainer", argv)
    try:
        config = load_config(args.config, overrides=args.set)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    log = configure_logging("trainer", run=config.name, level=config.log.level, fmt=config.log.format)
    try:  # a plug-in policy loss (say) runs on every rank
        load_service_plugins(config, args.config, args.plugin_dirs)
    except PluginError as exc:
        log.exception("cannot load plug-ins", error=f"{type(exc).__name__}: {exc}")
        return 2
    exit_rank(run_worker_rank(config))


if __name__ == "__main__":
    sys.exit(main())
