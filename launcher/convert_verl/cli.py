"""The body of `rft convert-verl SCRIPT [-o OUT.yaml]`: read the script (or stdin), convert every veRL
command, write the YAML (stdout, or OUT, OUT-2.yaml, ... for several commands), warnings on stderr."""

from __future__ import annotations

import sys
from pathlib import Path

from launcher.convert_verl.convert import ConversionError, NoVerlCommandError, convert_script
from launcher.convert_verl.shell import ShellSyntaxError


def _say(text: str) -> None:
    print(text, file=sys.stderr)


def output_paths(out: Path, n: int) -> list[Path]:
    """OUT for the first command, OUT-2.yaml, OUT-3.yaml, ... for the next ones."""
    return [out] + [out.with_name(f"{out.stem}-{i}{out.suffix or '.yaml'}") for i in range(2, n + 1)]


def convert_verl_main(script: str, out: Path | None) -> int:
    """Exit code: 0 converted, 2 unreadable script or no veRL command in it, 1 a conversion that fails."""
    if script == "-":
        text, source = sys.stdin.read(), "<stdin>"
    else:
        path = Path(script)
        if not path.is_file():
            _say(f"{script}: no such file (give a veRL script, or - to read one from stdin)")
            return 2
        text, source = path.read_text(), script
    try:
        conversions = convert_script(text, source)
    except (NoVerlCommandError, ShellSyntaxError) as exc:
        _say(f"{source}: {exc}" if isinstance(exc, ShellSyntaxError) else str(exc))
        return 2
    except ConversionError as exc:
        _say(f"{source}: {exc}")
        return 1
    several = len(conversions) > 1
    targets = output_paths(out, len(conversions)) if out is not None else [None] * len(conversions)
    for i, (conv, target) in enumerate(zip(conversions, targets, strict=True)):
        where = f"{source}:{conv.line}" if several else source
        for line in conv.warnings:
            _say(f"warning: {where}: {line}")
        for line in conv.notes:
            _say(f"note: {where}: {line}")
        if target is None:
            sys.stdout.write(("---\n" if i else "") + conv.yaml)
        else:
            target.write_text(conv.yaml)
            _say(f"wrote {target} (from {source}:{conv.line}); check it with `rft config show {target}`")
    return 0
