"""`python -m services.buffer --config X.yaml` (also `rft serve buffer`): run the buffer service."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from services.buffer.service import build
from services.common.app import service_main


def main(argv: Sequence[str] | None = None) -> int:
    return service_main("buffer", build, argv)


if __name__ == "__main__":
    sys.exit(main())
