"""Reading a veRL launch script as a POSIX shell would, just enough to find its `main_ppo` commands.

Handles line continuations (`\\` + newline), comments, single and double quotes, backslash escapes,
several commands (newlines, `;`, `&&`, `||`, `|`, `&`) and variables assigned earlier in the script
(`MODEL=...` or `export MODEL=...`, then `$MODEL`, `${MODEL}`, `${MODEL:-default}`). A variable the
script does not set (such as `$HOME`) becomes an OmegaConf interpolation `${oc.env:HOME}`, so the run
config resolves it on the machine that runs it, as the script would have. Nothing is executed: a
command substitution `$(...)` is kept as text and reported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BRACED = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*|[@*#?$!0-9])(?:(:?-)(.*))?$", re.S)
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_VERL_ENTRY = re.compile(r"^([\w./-]*[./])?main_ppo(\.py)?$")
_NOT_RUNNERS = ("echo", "printf", "cat", "grep", "sed")
_SEPARATORS = ("&&", "||", ";", "|", "&")


@dataclass
class _Word:
    parts: list[tuple[bool, str]] = field(default_factory=list)  # (expand?, text)

    def add(self, expand: bool, ch: str) -> None:
        if self.parts and self.parts[-1][0] == expand:
            self.parts[-1] = (expand, self.parts[-1][1] + ch)
        else:
            self.parts.append((expand, ch))


@dataclass
class ShellCommand:
    """One simple command: its words after quote removal and variable expansion, and where it starts."""

    line: int
    words: list[str]


@dataclass
class VerlCommand:
    """A `python -m verl.trainer.main_ppo` command: its arguments in order and what was dropped."""

    line: int
    args: list[str]
    notes: list[str] = field(default_factory=list)


class ShellSyntaxError(ValueError):
    """The script cannot be read as shell (an unclosed quote); the message gives the line."""


def _lex(text: str) -> list[tuple[int, list[_Word]]]:
    """Commands as lists of words; each word keeps which parts are subject to `$` expansion."""
    commands: list[tuple[int, list[_Word]]] = []
    words: list[_Word] = []
    word: _Word | None = None
    line, start, i, n = 1, 1, 0, len(text)

    def end_word() -> None:
        nonlocal word
        if word is not None:
            words.append(word)
            word = None

    def end_command() -> None:
        nonlocal words, start
        end_word()
        if words:
            commands.append((start, words))
        words, start = [], line

    while i < n:
        ch = text[i]
        if ch == "\\" and i + 1 < n:
            if text[i + 1] == "\n":
                line += 1
                i += 2
                continue
            word = word or _Word()
            word.add(False, text[i + 1])
            i += 2
        elif ch == "\n":
            line += 1
            end_command()
            start = line
            i += 1
        elif ch in " \t\r":
            end_word()
            i += 1
        elif ch == "#" and word is None:
            while i < n and text[i] != "\n":
                i += 1
        elif ch in "'\"":
            word = word or _Word()
            end = (_single_quoted if ch == "'" else _double_quoted)(text, i, word, line)
            line += text.count("\n", i, end)
            i = end
        elif any(text.startswith(sep, i) for sep in _SEPARATORS):
            sep = next(s for s in _SEPARATORS if text.startswith(s, i))
            end_command()
            i += len(sep)
        elif ch == "$" and text.startswith("$(", i):
            word = word or _Word()
            i = _command_substitution(text, i, word)
        else:
            word = word or _Word()
            word.add(True, ch)
            i += 1
    end_command()
    return commands


def _single_quoted(text: str, i: int, word: _Word, line: int) -> int:
    """Add the single-quoted string at `i` to `word` (nothing expands); the index after it."""
    close = text.find("'", i + 1)
    if close < 0:
        raise ShellSyntaxError(f"line {line}: unclosed single quote")
    for c in text[i + 1 : close]:
        word.add(False, c)
    return close + 1


def _double_quoted(text: str, i: int, word: _Word, line: int) -> int:
    """Add the double-quoted string at `i` to `word` (`$` expands, backslash escapes `$`, a backquote,
    a double quote, a backslash and a newline); the index after it."""
    j, n = i + 1, len(text)
    while j < n and text[j] != '"':
        if text[j] == "\\" and j + 1 < n and text[j + 1] in '$`"\\\n':
            if text[j + 1] != "\n":
                word.add(False, text[j + 1])
            j += 2
            continue
        word.add(True, text[j])
        j += 1
    if j >= n:
        raise ShellSyntaxError(f"line {line}: unclosed double quote")
    return j + 1


def _command_substitution(text: str, i: int, word: _Word) -> int:
    """Add the `$(...)` at `i` to `word` as it is (not run, not expanded); the index after it."""
    depth, j, n = 0, i + 1, len(text)
    while j < n:
        depth += {"(": 1, ")": -1}.get(text[j], 0)
        if depth == 0:
            break
        j += 1
    for c in text[i : j + 1]:
        word.add(False, c)
    return j + 1


class _Expander:
    """`$` expansion with the variables the script has set so far."""

    def __init__(self) -> None:
        self.vars: dict[str, str] = {}
        self.notes: list[str] = []

    def lookup(self, name: str, default: str | None) -> str:
        if name in self.vars:
            return self.vars[name]
        if name in ("@", "*") or name.isdigit() or name in ("#", "?", "$", "!"):
            self.notes.append(
                f"${name} (arguments or state of the shell) is not known when converting; dropped"
            )
            return ""
        return f"${{oc.env:{name}}}" if default is None else f"${{oc.env:{name},{default}}}"

    def expand(self, text: str) -> str:
        out, i = [], 0
        while i < len(text):
            ch = text[i]
            if ch != "$" or i + 1 >= len(text):
                out.append(ch)
                i += 1
                continue
            nxt = text[i + 1]
            if nxt == "{":
                close = text.find("}", i)
                if close < 0:
                    out.append(text[i:])
                    break
                m = _BRACED.match(text[i + 2 : close])
                if m is None:
                    out.append(text[i : close + 1])
                else:
                    default = self.expand(m.group(3)) if m.group(2) else None
                    out.append(self.lookup(m.group(1), default))
                i = close + 1
            elif nxt in "@*#?$!" or nxt.isdigit():
                out.append(self.lookup(nxt, None))
                i += 2
            elif m := _NAME.match(text, i + 1):
                out.append(self.lookup(m.group(0), None))
                i = m.end()
            else:
                out.append(ch)
                i += 1
        return "".join(out)

    def word(self, w: _Word) -> str:
        return "".join(self.expand(t) if exp else t for exp, t in w.parts)


def read_commands(text: str) -> tuple[list[ShellCommand], list[str]]:
    """The script's simple commands, expanded in order, and notes on what could not be resolved.

    Assignment-only commands (`A=1`, `export A=1`) set variables for the commands after them."""
    expander = _Expander()
    out: list[ShellCommand] = []
    for line, raw in _lex(text):
        words = [expander.word(w) for w in raw]
        body = words[1:] if words and words[0] in ("export", "readonly", "local", "declare") else words
        assigns = [_ASSIGN.match(w) for w in body]
        if body and all(assigns):
            for m in assigns:
                assert m is not None
                name, value = m.group(1), m.group(2)
                if "$(" in value or "`" in value:
                    expander.notes.append(
                        f"line {line}: {name} is set by a command substitution, which is not run; "
                        f"${name} becomes ${{oc.env:{name}}}"
                    )
                    expander.vars.pop(name, None)
                else:
                    expander.vars[name] = value
            continue
        out.append(ShellCommand(line, words))
    return out, expander.notes


def verl_commands(text: str) -> list[VerlCommand]:
    """Every `... verl.trainer.main_ppo key=value ...` command of the script, in order."""
    commands, notes = read_commands(text)
    found = []
    for cmd in commands:
        if cmd.words and cmd.words[0] in _NOT_RUNNERS:
            continue
        for i, w in enumerate(cmd.words):
            if _VERL_ENTRY.search(w):
                found.append(VerlCommand(cmd.line, [a for a in cmd.words[i + 1 :] if a], list(notes)))
                break
    return found
