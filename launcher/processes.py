"""One service as a local child process: started with `--config FILE --port-file PATH`, its output
redirected to `<job_dir>/log/<name>.log` (`first_error` finds the first exception it logged, for the
failure message of `rft run`), ready when it wrote its port and the gRPC health service
answers SERVING, stopped with SIGTERM (graceful) and then SIGKILL after a deadline. Once ready, `progress`
asks its `rft.v1.Liveness` (its heartbeat and step) for the supervisor's watchdog (launcher/watchdog.py).

Children run in their own session so a Ctrl-C in the terminal reaches only `rft run`, which then
stops them in order (explorers and trainer first, so the trainer flushes its checkpoint while the
buffer is still up). The processes a child starts share its process group: once the child has exited
(seen by `poll`, `running` or `wait`), what is left of its group is SIGKILLed, so nothing it started
outlives it (a SIGKILLed explorer's vLLM engine core and workers would otherwise keep running,
reparented to init, holding their memory while the restarted explorer starts new ones). `kill` (a hung
process) also SIGKILLs what it started in sessions of their own (torchrun's ranks), found under /proc
first: a SIGSTOPped rank would otherwise outlive its group, stopped. On Linux each child also gets `PR_SET_PDEATHSIG`: if `rft run` itself dies
without cleaning up (SIGKILL), the kernel sends the child SIGTERM, so no orphan keeps running.

The child sets that itself, in a few lines of Python that then exec the service (same pid), rather than
in a `preexec_fn`: a preexec_fn makes subprocess fork() instead of vfork(), and fork() runs gRPC's
atfork handlers, which can hang the launcher or crash the child while the launcher's own gRPC calls
(health checks of restarted services, the offline-data feeder) are in flight.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from rft.v1 import liveness_pb2, liveness_pb2_grpc

from launcher.watchdog import Answer
from services.common.config.services import TLSConfig
from services.common.healthcheck import check as health_check
from services.common.rpc.client import create_channel

# argv: the launcher's pid, then the command. prctl 1 = PR_SET_PDEATHSIG; exits if the launcher is gone.
_DIE_WITH_PARENT = """\
import ctypes, os, signal, sys
try:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
except OSError:
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)
os.execvp(sys.argv[2], sys.argv[2:])
"""


def _with_parent(argv: Sequence[str]) -> list[str]:
    """`argv`, run so that it dies with this process (Linux; elsewhere `argv` as it is)."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-I", "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]


_CHAIN = ("During handling of the above exception", "The above exception was the direct cause")
_SCAN_BYTES = 8 << 20  # how much of a log `first_error` reads at most


def _is_exception_line(line: str) -> bool:
    return bool(line) and not line[0].isspace() and not line.startswith(("Traceback", *_CHAIN))


def _exception_line(traceback: list[str]) -> str | None:
    """'Type: message' of a Python traceback's lines: its last exception (after any chained ones); the
    first line of that exception's message, the type without its module (`pkg.mod.PluginError`)."""
    found, previous = None, ""
    for line in traceback:
        if _is_exception_line(line) and (previous[:1].isspace() or previous.startswith("Traceback")):
            found = line.strip()
        if line.strip():
            previous = line
    if found is None:
        return None
    kind, sep, message = found.partition(":")
    return kind.rsplit(".", 1)[-1] + sep + message if " " not in kind else found


def _json_error(line: str) -> str | None:
    """The exception of a structlog JSON line that logged one (`log.exception`, or `error=` at error level)."""
    if not line.startswith("{"):
        return None
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    trace = record.get("exception")
    if isinstance(trace, str) and trace.strip():
        return _exception_line(trace.splitlines())
    if record.get("level") in ("error", "critical") and isinstance(record.get("error"), str):
        return record["error"]
    return None


def first_error(path: Path, offset: int = 0) -> str | None:
    """The first exception a service's log holds from byte `offset` on, as 'Type: message': a structlog
    JSON line that logged one, or an uncaught Python traceback (its last exception, after any chained
    ones). None if there is none."""
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            lines = fh.read(_SCAN_BYTES).decode("utf-8", errors="replace").splitlines()
    except OSError:
        return None
    block: list[str] | None = None  # the lines of the traceback being read
    for i, line in enumerate(lines):
        if block is None:
            found = _json_error(line.strip())
            if found:
                return found
            if line.startswith("Traceback (most recent call last):"):
                block = [line]
            continue
        block.append(line)
        if _is_exception_line(line):
            following = next((x for x in lines[i + 1 : i + 4] if x.strip()), "")
            if not following.startswith(_CHAIN):  # else a chained exception's traceback follows
                return _exception_line(block)
    return _exception_line(block) if block else None


def tail(path: Path, lines: int = 20) -> str:
    """The last `lines` lines of a log file ('' when it does not exist)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class ServiceProcess:
    """A service to run: `name` (log file and messages), the command, extra environment."""

    name: str
    argv: Sequence[str]
    log_file: Path
    port_file: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    # whether the run is over when this process exits by itself (trainer, explorers, feeders)
    finishes_run: bool = False
    proc: subprocess.Popen[bytes] | None = None
    port: int | None = None
    # where this start's output begins in the log file (the file keeps earlier starts' output)
    log_offset: int = 0
    # what a client of the service needs (`services.auth_token`, `services.tls`): for `progress`
    auth_token: str | None = None
    tls: TLSConfig | None = None
    # this start's exit was seen and what was left of its process group killed
    _reaped: bool = field(default=False, repr=False)

    def start(self, cwd: Path | None = None, extra_env: Mapping[str, str] | None = None) -> None:
        """Start (or start again, after it exited): the port is read anew from the port file."""
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self.port = None
        if self.port_file is not None:
            self.port_file.parent.mkdir(parents=True, exist_ok=True)
            self.port_file.unlink(missing_ok=True)
        log = self.log_file.open("ab")
        self.log_offset = log.tell()
        self._reaped = False
        try:
            self.proc = subprocess.Popen(
                _with_parent(self.argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env, **(extra_env or {})},
                cwd=cwd,
                start_new_session=True,
            )
        finally:
            log.close()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def poll(self) -> int | None:
        """The exit code, or None while it runs (or was never started)."""
        if self.proc is None:
            return None
        code = self.proc.poll()
        if code is not None:
            self._reap()
        return code

    @property
    def running(self) -> bool:
        return self.proc is not None and self.poll() is None

    def _reap(self) -> None:
        """The first time its exit is seen: SIGKILL what is left of its process group (its children,
        and theirs, that outlived it). Right away, while the group's id cannot have been reused: the
        kernel gives no new process the id of a group that still has members."""
        if self._reaped or self.proc is None:
            return
        self._reaped = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    @property
    def restarts_file(self) -> Path | None:
        """Where the supervisor writes how often it restarted this process (`rft top` reads it)."""
        return None if self.port_file is None else self.port_file.with_name(f"{self.name}.restarts")

    def read_port(self) -> int | None:
        """The bound port once the service wrote it (after its gRPC server started)."""
        if self.port is None and self.port_file is not None and self.port_file.is_file():
            text = self.port_file.read_text().strip()
            self.port = int(text) if text else None
        return self.port

    @property
    def address(self) -> str:
        if self.port is None:
            raise RuntimeError(f"{self.name} has no port yet")
        return f"127.0.0.1:{self.port}"

    def healthy(self) -> bool:
        """True when the port is known and the health service answers SERVING (over `tls` when on)."""
        if self.read_port() is None:
            return False
        files: dict[str, str | None] = {}
        if self.tls is not None and self.tls.client_tls:
            cert, key = self.tls.client_identity or (None, None)
            files = {"ca_file": self.tls.ca_file, "cert_file": cert, "key_file": key}
        try:
            return health_check(self.address, timeout_s=2.0, **files) == "SERVING"
        except Exception:  # unreachable for now: grpc.RpcError, or a reset connection
            return False

    def channel(self, timeout_s: float) -> grpc.aio.Channel:
        """A client channel to it (once ready: the port is known), with `auth_token` and `tls`; the
        caller closes it. One per watch, so each liveness question reuses the connection."""
        return create_channel(self.address, auth_token=self.auth_token, tls=self.tls, timeout_s=timeout_s)

    @staticmethod
    async def progress(channel: grpc.aio.Channel, timeout_s: float) -> Answer | None:
        """Its answer to `rft.v1.Liveness/Progress` within `timeout_s`, or None when none came."""
        try:
            reply = await liveness_pb2_grpc.LivenessStub(channel).Progress(
                liveness_pb2.ProgressRequest(), timeout=timeout_s
            )
        except grpc.RpcError:  # DEADLINE_EXCEEDED: stopped or wedged; UNAVAILABLE: gone
            return None
        return Answer(
            reply.heartbeat_age_s,
            reply.unit,
            reply.step,
            reply.moved_age_s,
            stuck=reply.stuck,
            stack=reply.stack,
        )

    def terminate(self) -> None:
        """SIGTERM: the graceful stop of every service. Then SIGCONT: a stopped (SIGSTOP) process acts on
        a signal only once it runs again, and a running one ignores SIGCONT."""
        if self.running:
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
                self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL it, its process group, and every process it started in a session of its own
        (torchrun's ranks: a stopped rank would never notice its group gone and stay, stopped, forever)."""
        if self.running:
            assert self.proc is not None
            others = descendants(self.proc.pid)
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
            for pid in others:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    def wait(self, timeout_s: float) -> int | None:
        if self.proc is None:
            return None
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None
        self._reap()
        return code

    def tail(self, lines: int = 20) -> str:
        return tail(self.log_file, lines)

    def first_error(self) -> str | None:
        """The first exception this start of the process logged ('Type: message'), if any."""
        return first_error(self.log_file, self.log_offset)


def descendants(pid: int) -> list[int]:
    """The processes `pid` started, and theirs (Linux: /proc; elsewhere none)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def describe_exit(code: int) -> str:
    """'exited with code 1', or 'exited with code -9 (killed by SIGKILL)' for a signal."""
    if code < 0:
        try:
            return f"exited with code {code} (killed by {signal.Signals(-code).name})"
        except ValueError:
            return f"exited with code {code} (killed by signal {-code})"
    return f"exited with code {code}"
