"""One-shot preparation of the compose stack's data volume (the `prepare` service runs it before the
trainer and the explorers start): the tiny model and the arithmetic taskset that `config/run.yaml`
points at. Nothing is downloaded; both are written locally, and only when missing, so restarts and
`--scale` keep what is there.

    python deploy/prepare.py /data     # -> /data/models/tiny, /data/tasks/arithmetic.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from launcher.tiny_model import make_tiny_model
from services.explorer.workflows.arithmetic import make_arithmetic_rows


def prepare(data_dir: Path, rows: int = 2048, seed: int = 0) -> list[str]:
    """Write what is missing under `data_dir`; returns what was written."""
    written = []
    model = data_dir / "models" / "tiny"
    if not (model / "config.json").exists():
        make_tiny_model(model, seed=seed)
        written.append(str(model))
    tasks = data_dir / "tasks" / "arithmetic.jsonl"
    if not tasks.exists():
        tasks.parent.mkdir(parents=True, exist_ok=True)
        tmp = tasks.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in make_arithmetic_rows(rows, seed=seed)))
        tmp.replace(tasks)
        written.append(str(tasks))
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the compose stack's tiny model and taskset.")
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    written = prepare(args.data_dir, args.rows, args.seed)
    print("prepared: " + (", ".join(written) if written else "nothing to do (already there)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
