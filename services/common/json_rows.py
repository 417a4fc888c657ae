"""Rows of a `.jsonl` / `.json` file without the `datasets` library, for images that do not carry it.

Tasksets and offline data are read through `datasets` (parquet, csv, `save_to_disk` folders, hub-style
data folders). A lean GPU image (the GPU check carries its packages in by hand, and `datasets` pulls in
pyarrow and pandas, ~55 MB of wheels) may lack it; a jsonl or json file still reads there, as
`datasets` would read it: one dict per line (or per element of a top-level list, or per row of a
`{"data": [...]}` object), every row holding the union of all rows' keys (None where a row lacks one,
as `datasets` fills a missing column). Other formats still need `datasets`: the error says so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

JSON_SUFFIXES = (".jsonl", ".json")


class JsonRowsError(ValueError):
    """The file cannot be read as rows; the message names the file and the line."""


def _rows_of(p: Path) -> list[dict[str, Any]]:
    text = p.read_text(encoding="utf-8")
    if p.suffix.lower() == ".json" and text.lstrip()[:1] in ("[", "{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            doc = None  # a .json file of one object per line: read below as jsonl
        if isinstance(doc, list):
            rows = doc
        elif isinstance(doc, dict) and isinstance(doc.get("data"), list):
            rows = doc["data"]
        elif isinstance(doc, dict):
            rows = [doc]
        else:
            rows = None
        if rows is not None:
            bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
            if bad is not None:
                raise JsonRowsError(f"{p}: element {bad + 1} is not a JSON object")
            return rows
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise JsonRowsError(f"{p} line {n}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise JsonRowsError(f"{p} line {n}: not a JSON object")
        rows.append(row)
    return rows


def read_json_rows(path: str | Path) -> list[dict[str, Any]]:
    """Every row of a jsonl/json file, each with the union of the rows' keys (first-seen order)."""
    p = Path(path)
    if p.suffix.lower() not in JSON_SUFFIXES:
        raise JsonRowsError(
            f"{p}: reading {p.suffix or 'this'} data needs the `datasets` library (not installed); "
            f"install it, or give a {' or '.join(JSON_SUFFIXES)} file"
        )
    rows = _rows_of(p)
    keys: dict[str, None] = {}
    for row in rows:
        keys.update(dict.fromkeys(row))
    return [{k: row.get(k) for k in keys} for row in rows]


def datasets_available() -> bool:
    """Whether the `datasets` library can be imported here."""
    try:
        import datasets  # noqa: F401
    except ImportError:
        return False
    return True
