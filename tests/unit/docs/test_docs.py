"""The documentation (README.md, docs/): the configuration reference is what the config schema generates,
every command block marked runnable (an HTML comment `<!-- runnable -->` on the line before a ```bash
fence) runs and exits 0 from the repository root, and no page points at a README section that moved."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
MARK = "<!-- runnable -->"


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _runnable_blocks() -> list[tuple[str, str]]:
    """(page:line, script) for each ```bash block right after the runnable mark."""
    blocks = []
    for page in _pages():
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() != MARK:
                continue
            assert lines[i + 1].startswith("```bash"), (
                f"{page.name}:{i + 1}: {MARK} is not followed by ```bash"
            )
            end = lines.index("```", i + 2)
            blocks.append((f"{page.name}:{i + 1}", "\n".join(lines[i + 2 : end])))
    return blocks


BLOCKS = _runnable_blocks()


def test_the_config_reference_is_the_schema():
    spec = importlib.util.spec_from_file_location(
        "gen_config_reference", ROOT / "scripts" / "gen_config_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = module.render()
    assert (ROOT / "docs" / "config-reference.md").read_text() == text, (
        "docs/config-reference.md is stale: run python scripts/gen_config_reference.py"
    )
    from services.common.config.runtime import SynchronizerConfig

    for key in SynchronizerConfig.model_fields:  # every key of a section is a row
        assert f"| `{key}` |" in text, key


def test_there_are_runnable_blocks():
    assert len(BLOCKS) >= 3, BLOCKS


@pytest.mark.parametrize("where,script", BLOCKS, ids=[where for where, _ in BLOCKS])
def test_runnable_block_runs(where, script, tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `rft` of this venv
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, (
        f"{where} exited {done.returncode}:\n{script}\n--- stderr\n{done.stderr[-3000:]}"
    )
    assert done.stdout.strip(), f"{where} printed nothing"


def test_no_page_points_at_a_moved_readme_section():
    """README.md is a front page now: links into it by anchor, or to deploy/README.md's sections, are stale."""
    stale = re.compile(r"README\.md#|README \"|README, \"|deploy/README\.md\"")
    hits = []
    for base in ("docs", "deploy", "examples", "services", "launcher", "bench", "scripts"):
        for path in (ROOT / base).rglob("*"):
            if path.is_file() and path.suffix in {".md", ".py", ".yaml", ".yml", ".sh", ".txt"}:
                for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                    if stale.search(line):
                        hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not hits, "\n".join(hits)


def test_every_repository_path_the_docs_name_exists():
    """A path the docs name (`services/...`, `scripts/...`, ...) is in the repository, so a moved module
    cannot leave a page pointing at nothing. Files the user creates are the exceptions."""
    pattern = re.compile(
        r"(?<![\w/.-])((?:services|launcher|scripts|bench|tests|examples|deploy|protos|requirements)/[\w./-]*\w)"
    )
    made_by_the_user = ("deploy/.env", "deploy/k8s/secret.env", "deploy/tls")
    missing = sorted(
        {
            f"{page.name}: {path}"
            for page in _pages()
            for path in pattern.findall(page.read_text())
            if not path.startswith(made_by_the_user) and not (ROOT / path).exists()
        }
    )
    assert not missing, "\n".join(missing)


def test_the_readme_links_resolve():
    """README.md is outside the site mkdocs checks: each of its relative links names a file that exists,
    and an anchor into a docs page names one of that page's headings."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", (ROOT / "README.md").read_text()):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        if not (ROOT / path).exists():
            broken.append(target)
        elif anchor and path.endswith(".md"):
            headings = re.findall(r"^#+ (.*)$", (ROOT / path).read_text(), flags=re.M)
            slugs = {re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", h).strip().lower()) for h in headings}
            if anchor not in slugs:
                broken.append(target)
    assert not broken, broken
