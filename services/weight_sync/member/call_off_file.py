"""A call-off that reaches a broadcast member living in another process (a vLLM worker) through a file.

The explorer learns from the synchronizer that a join or a broadcast was called off and abandons it
(`superseded.py`); an in-process group gives up within a second. A vLLM worker's group lives in the
worker's process, and the engine core that would carry a message to it is itself blocked in the
`collective_rpc` that runs the join or the receive. So the engine's process writes the operation's
token into a small file (`CallOffFile.call_off(token)`, an atomic rename) and the worker watches for
that token while the operation runs (`watching(token, on_set)`: a thread looking every 0.2 s, calling
`on_set` (e.g. `BroadcastGroup.abandon`) each time it finds it, so an abandon that lands before the
receive has cleared its event is set again). Tokens are never reused (`next_token()`, one per join or
receive), so an old call-off never touches a later operation. Members on other hosts (a multi-node
executor) do not see the file and give up at the group's timeout.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

LOOK_S = 0.2  # how often a watching worker looks at the file


class CallOffFile:
    """The engine's side (`create`, `next_token`, `call_off`, `remove`) and the worker's (`watching`)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._tokens = 0
        self._lock = threading.Lock()

    @classmethod
    def create(cls) -> CallOffFile:
        """A new file in a folder of its own (removed by `remove`)."""
        return cls(Path(tempfile.mkdtemp(prefix="rft-call-off-")) / "called_off")

    def next_token(self) -> int:
        with self._lock:
            self._tokens += 1
            return self._tokens

    def call_off(self, token: int) -> None:
        """Say that the operation holding `token` is called off (any thread)."""
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(str(int(token)))
        os.replace(tmp, self.path)

    def called_off(self, token: int) -> bool:
        try:
            return self.path.read_text().strip() == str(int(token))
        except (FileNotFoundError, ValueError):
            return False

    @contextlib.contextmanager
    def watching(self, token: int, on_set: Callable[[], None]) -> Iterator[threading.Event]:
        """While the block runs, call `on_set` whenever `token` is found called off; the event yielded
        is set at the first such look (a join's `abandon`)."""
        seen, done = threading.Event(), threading.Event()

        def watch() -> None:
            while not done.wait(LOOK_S):
                if self.called_off(token):
                    seen.set()
                    on_set()

        thread = threading.Thread(target=watch, name="weight-sync-call-off", daemon=True)
        thread.start()
        try:
            yield seen
        finally:
            done.set()
            thread.join()

    def remove(self) -> None:
        shutil.rmtree(self.path.parent, ignore_errors=True)
