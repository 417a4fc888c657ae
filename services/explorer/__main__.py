"""`python -m services.explorer --config X.yaml [--explorer-id ID] [--shard i/n]` (also
`rft serve explorer`): run one explorer service."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from services.common.app import service_main
from services.explorer.service import make_build


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument(
        "--explorer-id", default=None, help="this explorer's id (default: RFT_EXPLORER_ID or explorer.name)"
    )
    parser.add_argument(
        "--shard", default=None, help="take taskset rows i mod n (i/n; default RFT_EXPLORER_SHARD or 0/1)"
    )
    ours, rest = parser.parse_known_args(argv)
    return service_main("explorer", make_build(ours.explorer_id, ours.shard), rest)


if __name__ == "__main__":
    sys.exit(main())
