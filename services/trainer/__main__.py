"""`python -m services.trainer --config X.yaml` (also `rft serve trainer`), or under
`torchrun --nproc_per_node N -m services.trainer --config X.yaml`: rank 0 serves gRPC, the other
ranks follow rank 0's commands."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from services.common.app import parse_args, service_main
from services.common.config import ConfigError, load_config
from services.common.log import configure_logging
from services.trainer.service import build, run_worker_rank


def main(argv: Sequence[str] | None = None) -> int:
    if int(os.environ.get("RANK", "0")) == 0:
        return service_main("trainer", build, argv)
    args = parse_args("trainer", argv)
    try:
        config = load_config(args.config, overrides=args.set)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    configure_logging("trainer", run=config.name, level=config.log.level, fmt=config.log.format)
    return run_worker_rank(config)


if __name__ == "__main__":
    sys.exit(main())
