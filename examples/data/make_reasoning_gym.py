"""Write the SFT warm-up rows of a reasoning-gym example: the generator's own answers to its taskset.

    python examples/data/make_reasoning_gym.py     # examples/reasoning_gym.yaml -> examples/data/reasoning_gym_sft.jsonl
    python examples/data/make_reasoning_gym.py --config my_run.yaml --out /tmp/sft.jsonl

The rows are exactly those the config's taskset generates (`source: reasoning_gym`, the same dataset,
size, seed and config, through the same code as the explorer), reduced to the prompt and the answer
under the keys of the SFT stage's `experience_buffer.format`, one JSON object per line. The file is
written to that stage's `experience_buffer.path` unless `--out` is given. Needs the `reasoning-gym` extra.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from services.common.config import RFTConfig, load_config  # noqa: E402
from services.common.config.loader import stage_configs  # noqa: E402
from services.common.taskset_sources import source_rows  # noqa: E402


def sft_rows(config: RFTConfig) -> tuple[list[dict[str, str]], str | None]:
    """(rows, the SFT stage's data path) for the first `reasoning_gym` taskset of the config."""
    stages = [c for _, c in stage_configs(config)] or [config]
    tasksets = [
        t for c in stages for t in ([c.buffer.explorer_input.taskset] + c.buffer.explorer_input.tasksets)
    ]
    taskset = next((t for t in tasksets if t is not None and t.source != "file"), None)
    if taskset is None:
        raise SystemExit("the config has no taskset with a `source` (e.g. `source: reasoning_gym`)")
    sft = next((c for c in stages if c.buffer.trainer_input.experience_buffer.path), None)
    fmt = sft.buffer.trainer_input.experience_buffer.format if sft else taskset.format
    generated = source_rows(taskset.source, taskset.source_args, taskset.format, "taskset")
    rows = [
        {fmt.prompt_key: r[taskset.format.prompt_key], fmt.response_key: r[taskset.format.response_key]}
        for r in generated
    ]
    return rows, sft.buffer.trainer_input.experience_buffer.path if sft else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "examples" / "reasoning_gym.yaml")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows, path = sft_rows(load_config(args.config))
    out = args.out or (Path(path) if path else None)
    if out is None:
        raise SystemExit("the config has no SFT stage (experience_buffer.path); give --out")
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} rows to {out}")


if __name__ == "__main__":
    main()
