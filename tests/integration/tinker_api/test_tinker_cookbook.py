"""`tinker-cookbook`'s `recipes/sl_loop.py`, unchanged, against `rft serve tinker`, offline.

The recipe is run as shipped (`python -m tinker_cookbook.recipes.sl_loop`) with only its own command-line
options: the server's URL, a model name, batch size, learning rate, steps, log folder. Everything it
would download is put where the libraries look offline, in a test-owned HF_HOME: the dataset
`HuggingFaceH4/no_robots` (the quickstart's arithmetic questions as no_robots-schema chats) in the
`datasets` cache, and the tokenizer of `Qwen/Qwen3-8B-Base` (the tiny model's, which the server serves
under that name) in the hub cache. The recipe's own logged training NLL must fall and it must finish.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import Dataset, DatasetInfo, SplitDict, SplitInfo
from datasets.arrow_writer import ArrowWriter

from tests.support.rft_run import ROOT, tiny_model
from tests.support.tinker_loop import rows

from .conftest import API_KEY, COOKBOOK_MODEL

pytestmark = pytest.mark.timeout(300)

COOKBOOK = ROOT / ".cache" / "tinker-cookbook"
REV = "0" * 40  # any commit id: offline, the caches are read as they are
STEPS = 5


def offline_hf_home(home: Path) -> None:
    """The no_robots dataset in the `datasets` cache and the model's tokenizer in the hub cache."""
    chats = [
        {
            "prompt": r["question"],
            "prompt_id": f"arith-{i}",
            "messages": [
                {"content": r["question"], "role": "user"},
                {"content": r["answer"], "role": "assistant"},
            ],
            "category": "Math",
        }
        for i, r in enumerate(rows())
    ]
    # what `load_dataset("HuggingFaceH4/no_robots")` left behind online: <cache>/<ns>___<name>/<config>/<version>/<hash>
    folder = home / "datasets" / "HuggingFaceH4___no_robots" / "default" / "0.0.0" / REV
    folder.mkdir(parents=True)
    splits = SplitDict(dataset_name="no_robots")
    for split, part in (("train", chats), ("test", chats[:5])):
        data = Dataset.from_list(part)
        with ArrowWriter(path=str(folder / f"no_robots-{split}.arrow")) as writer:
            writer.write_table(data.data.table)
            writer.finalize()
        splits.add(SplitInfo(name=split, num_examples=len(part), dataset_name="no_robots"))
    info = DatasetInfo(features=data.features, config_name="default", dataset_name="no_robots", splits=splits)
    info.write_to_directory(str(folder))
    # and what `AutoTokenizer.from_pretrained(COOKBOOK_MODEL)` left: models--<org>--<name>/snapshots/<rev>
    repo = home / "hub" / f"models--{COOKBOOK_MODEL.replace('/', '--')}"
    (repo / "snapshots" / REV).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REV)
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copy(tiny_model() / name, repo / "snapshots" / REV / name)


@pytest.mark.skipif(
    not (COOKBOOK / "tinker_cookbook" / "recipes" / "sl_loop.py").is_file(),
    reason=f"tinker-cookbook is not installed in {COOKBOOK} (scripts/setup.sh installs it there)",
)
def test_cookbook_sl_loop_runs_unchanged_and_its_nll_falls(tinker_url: str, tmp_path: Path) -> None:
    offline_hf_home(tmp_path / "hf")
    logs = tmp_path / "logs"
    argv = [
        sys.executable, "-m", "tinker_cookbook.recipes.sl_loop", f"base_url={tinker_url}",
        f"model_name={COOKBOOK_MODEL}", "batch_size=5", "learning_rate=1e-3", f"max_steps={STEPS}",
        f"log_path={logs}",
    ]  # fmt: skip
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("TINKER_", "HF_", "WANDB_"))}
    environ.update(
        PYTHONPATH=str(COOKBOOK),
        TINKER_API_KEY=API_KEY,
        HF_HOME=str(tmp_path / "hf"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
    )
    done = subprocess.run(argv, cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Training completed" in done.stdout + done.stderr
    metrics = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(STEPS))
    nll = [m["train_mean_nll"] for m in metrics]
    print("sl_loop train_mean_nll:", [round(x, 3) for x in nll])
    assert nll[-1] < nll[0] - 0.3, nll
    final = json.loads((logs / "checkpoints.jsonl").read_text().splitlines()[-1])
    assert final["name"] == "final" and final["batch"] == STEPS  # the recipe's own end-of-run record
    assert final["state_path"].endswith("/weights/final")
    assert final["sampler_path"].endswith("/sampler_weights/final")
