"""`python -m services.synchronizer --config X.yaml` (also `rft serve synchronizer`): run the synchronizer."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from services.common.app import service_main
from services.synchronizer.service import build


def main(argv: Sequence[str] | None = None) -> int:
    return service_main("synchronizer", build, argv)


if __name__ == "__main__":
    sys.exit(main())
