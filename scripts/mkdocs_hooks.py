"""MkDocs hook (mkdocs.yml `hooks:`): nav entries listed in OPTIONAL_PAGES whose file is not in docs/ are
dropped before the build, so a page another change adds can be in the nav before it lands, while any
other missing page still fails `mkdocs build --strict`."""

from __future__ import annotations

from pathlib import Path

OPTIONAL_PAGES = {"tinker.md"}


def _prune(items: list, docs_dir: Path) -> list:
    kept = []
    for item in items:
        if isinstance(item, dict):
            [(title, target)] = item.items()
            if isinstance(target, list):
                kept.append({title: _prune(target, docs_dir)})
            elif target in OPTIONAL_PAGES and not (docs_dir / target).is_file():
                continue
            else:
                kept.append(item)
        else:
            kept.append(item)
    return kept


def on_config(config):
    config["nav"] = _prune(config["nav"], Path(config["docs_dir"]))
    return config
