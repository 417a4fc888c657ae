"""Reading tasksets: jsonl, json, parquet files and HF `datasets` folders, through the `datasets` library.

A `Taskset` hands out rows in the order of its `data_selector` (sequential; `shuffle`: a fresh seeded
permutation per epoch; `random`: seeded draws with replacement), for `buffer.total_epochs` epochs, and
keeps a position (epoch, offset) that is saved with the explorer's state and restored on resume.
A row that lacks a key its format needs is reported once with the file and row number, then skipped
(or, with `on_bad_row: error`, stops the explorer with that message) — never a stack trace.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from services.common.config import TasksetConfig
from services.common.json_rows import JsonRowsError, datasets_available, read_json_rows
from services.common.log import get_logger
from services.explorer.tasks import BadRow, check_row

log = get_logger("explorer.tasksets")
FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


class TasksetError(RuntimeError):
    """A taskset cannot be read, or a bad row met `on_bad_row: error`. The message says where."""


def load_rows(path: str, split: str = "train", subset_name: str | None = None) -> Any:
    """A `datasets.Dataset` for a file, a `save_to_disk` folder (Dataset or DatasetDict) or a data folder;
    where `datasets` is not installed, a jsonl/json file's rows as a list (`services.common.json_rows`)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise TasksetError(f"taskset path {path!r} does not exist")
    if not datasets_available():
        try:
            return read_json_rows(p)
        except (JsonRowsError, OSError) as exc:
            raise TasksetError(f"cannot read taskset {path!r}: {exc}") from None
    import datasets

    datasets.disable_progress_bars()
    try:
        if p.is_file():
            builder = FILE_BUILDERS.get(p.suffix.lower())
            if builder is None:
                raise TasksetError(
                    f"{path}: unknown file type {p.suffix!r}; use one of {', '.join(FILE_BUILDERS)}"
                )
            return datasets.load_dataset(builder, data_files=str(p), split="train")
        if subset_name and (p / subset_name).is_dir():
            p = p / subset_name
        if (p / "dataset_info.json").is_file() or (p / "dataset_dict.json").is_file():
            loaded = datasets.load_from_disk(str(p))
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise TasksetError(f"{path}: no split {split!r} (has: {', '.join(loaded)})")
                return loaded[split]
            return loaded
        return datasets.load_dataset(str(p), name=subset_name, split=split)
    except TasksetError:
        raise
    except Exception as exc:  # datasets raises many types on malformed files; report them plainly
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TasksetError(f"cannot read taskset {path!r}: {type(exc).__name__}: {first}") from None


@dataclass
class Position:
    epoch: int = 0
    offset: int = 0  # rows of this epoch already handed out (bad ones included)


class Taskset:
    """Rows of one taskset in selector order, epoch after epoch, with a resumable position."""

    def __init__(
        self,
        config: TasksetConfig,
        *,
        name: str,
        total_epochs: int = 1,
        needs_response: Callable[[Mapping[str, Any]], bool] | bool = True,
        shard: tuple[int, int] = (0, 1),
        rows: Any = None,
    ):
        self.config = config
        self.name = name
        self.total_epochs = total_epochs
        self._needs_response = needs_response
        self.data = rows if rows is not None else load_rows(config.path, config.split, config.subset_name)
        index, count = shard
        self._indices = np.arange(index, len(self.data), count, dtype=np.int64)
        self.position = Position()
        self.bad_rows = 0
        self._reported: set[int] = set()
        self._order_cache: tuple[int, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self._indices)

    @property
    def exhausted(self) -> bool:
        return len(self) == 0 or self.position.epoch >= self.total_epochs

    def _order(self, epoch: int) -> np.ndarray:
        if self._order_cache is not None and self._order_cache[0] == epoch:
            return self._order_cache[1]
        sel = self.config.data_selector
        rng = np.random.default_rng([sel.seed, epoch])
        if sel.selector_type == "shuffle":
            order = self._indices[rng.permutation(len(self._indices))]
        elif sel.selector_type == "random":
            order = self._indices[rng.integers(0, len(self._indices), size=len(self._indices))]
        else:
            order = self._indices
        self._order_cache = (epoch, order)
        return order

    def next_row(self) -> tuple[int, dict[str, Any], int] | None:
        """(row index, row, epoch) of the next good row, or None when every epoch is done."""
        while not self.exhausted:
            epoch = self.position.epoch
            order = self._order(epoch)
            index = int(order[self.position.offset])
            self.position.offset += 1
            if self.position.offset >= len(order):
                self.position = Position(epoch + 1, 0)
            row = self.data[index]
            try:
                needs = self._needs_response(row) if callable(self._needs_response) else self._needs_response
                check_row(row, self.config.format, needs)
            except BadRow as exc:
                self._bad_row(index, str(exc))
                continue
            return index, row, epoch
        return None

    def _bad_row(self, index: int, reason: str) -> None:
        where = f"taskset {self.name!r} ({self.config.path}) row {index + 1}: {reason}"
        if self.config.on_bad_row == "error":
            raise TasksetError(where + "; fix the row or set on_bad_row: skip")
        self.bad_rows += 1
        if index not in self._reported:
            self._reported.add(index)
            log.warning("bad taskset row skipped", detail=where)

    def state(self) -> dict[str, int]:
        return {"epoch": self.position.epoch, "offset": self.position.offset, "rows": len(self)}

    def load_state(self, state: Mapping[str, int]) -> None:
        if int(state.get("rows", len(self))) != len(self):
            raise TasksetError(
                f"taskset {self.name!r} has {len(self)} rows but the saved position was taken with "
                f"{state.get('rows')}; the file changed since the run started"
            )
        self.position = Position(int(state["epoch"]), int(state["offset"]))
