"""Opening a data file or folder as rows: a taskset (services/explorer/tasksets.py) and a train stage's
offline data (launcher/offline_data.py) are read the same way.

Through the `datasets` library: a jsonl/json/parquet/csv file, a `save_to_disk` folder (Dataset or
DatasetDict, then `split`) or a data folder named by split. Where `datasets` is not installed, a jsonl/json
file's rows as a list (services/common/json_rows.py). Every failure is a `DataFileError` naming the path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from services.common.json_rows import JsonRowsError, datasets_available, read_json_rows

FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


class DataFileError(ValueError):
    """The data cannot be read; the message names the path (as `what`, e.g. "taskset")."""


def load_data(path: str, split: str = "train", subset_name: str | None = None, *, what: str = "data") -> Any:
    """A `datasets.Dataset` for a file, a `save_to_disk` folder or a data folder (`subset_name`: a subfolder
    or the dataset's config name); without `datasets`, a jsonl/json file's rows as a list. `what` names the
    data in error messages."""
    p = Path(path).expanduser()
    if not p.exists():
        raise DataFileError(f"{what} {path!r} does not exist")
    if not datasets_available():
        try:
            return read_json_rows(p)
        except (JsonRowsError, OSError) as exc:
            raise DataFileError(f"cannot read {what} {path!r}: {exc}") from None
    import datasets

    datasets.disable_progress_bars()
    try:
        if p.is_file():
            builder = FILE_BUILDERS.get(p.suffix.lower())
            if builder is None:
                raise DataFileError(
                    f"{path}: unknown file type {p.suffix!r}; use one of {', '.join(FILE_BUILDERS)}"
                )
            return datasets.load_dataset(builder, data_files=str(p), split="train")
        if subset_name and (p / subset_name).is_dir():
            p = p / subset_name
        if (p / "dataset_info.json").is_file() or (p / "dataset_dict.json").is_file():
            loaded = datasets.load_from_disk(str(p))
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise DataFileError(f"{path}: no split {split!r} (has: {', '.join(loaded)})")
                return loaded[split]
            return loaded
        return datasets.load_dataset(str(p), name=subset_name, split=split)
    except DataFileError:
        raise
    except Exception as exc:  # datasets raises many types on malformed files; report them plainly
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataFileError(f"cannot read {what} {path!r}: {type(exc).__name__}: {first}") from None
