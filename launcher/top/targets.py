"""Where a job's services listen, for `rft top`: from a job folder of `rft run` (each process writes its
bound port to `run/<name>.port`; `run/<name>.restarts` holds the supervisor's restart count), from a run
config (the stage whose job folder has the newest port file, else its `services.*` addresses, as a
compose stack sets them), and from flags, which win. The bearer token and TLS settings come from the
config (`services.auth_token`, `RFT_AUTH_TOKEN`, `services.tls`), as for every other client."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from services.common.config import ConfigError, RFTConfig, load_config, resolve
from services.common.config.services import TLSConfig

KINDS = ("synchronizer", "buffer", "trainer")  # anything else is an explorer


class TargetError(ValueError):
    """Nothing to watch: the path is neither a job folder nor a config, or names no service."""


@dataclass
class Target:
    name: str  # buffer, trainer, synchronizer, explorer, explorer-0, ...
    address: str  # host:port ("" = not known yet: its port file is not written)
    restarts_file: Path | None = None

    @property
    def kind(self) -> str:
        return self.name if self.name in KINDS else "explorer"

    def restarts(self) -> int | None:
        """The supervisor's restart count (0 when its file is absent); None without a job folder."""
        if self.restarts_file is None:
            return None
        try:
            return int(self.restarts_file.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0


@dataclass
class Targets:
    services: list[Target]
    job_dir: Path | None = None
    auth_token: str | None = None
    tls: TLSConfig | None = None
    source: str = ""
    # kinds whose addresses came from flags (never replaced by the job folder's port files)
    flag_kinds: frozenset[str] = field(default=frozenset(), repr=False)

    def reread_ports(self) -> None:
        """A restarted process writes its port again: read the job folder's port files anew."""
        if self.job_dir is not None:
            found = [t for t in _from_run_dir(self.job_dir) if t.kind not in self.flag_kinds]
            pinned = [t for t in self.services if t.kind in self.flag_kinds]
            self.services = _ordered([*found, *pinned]) or self.services


def _ordered(targets: list[Target]) -> list[Target]:
    rank = {k: i for i, k in enumerate(KINDS)}
    return sorted(targets, key=lambda t: (rank.get(t.kind, len(KINDS)), t.name))


def _from_run_dir(job_dir: Path) -> list[Target]:
    out = []
    for port_file in sorted((job_dir / "run").glob("*.port")):
        name = port_file.stem
        try:
            port = port_file.read_text().strip()
        except OSError:
            port = ""
        address = f"127.0.0.1:{port}" if port.isdigit() else ""
        out.append(Target(name, address, port_file.with_name(f"{name}.restarts")))
    return out


def _newest_port_file(job_dir: Path) -> float:
    return max((p.stat().st_mtime for p in (job_dir / "run").glob("*.port")), default=-1.0)


def _load(path: Path) -> RFTConfig:
    try:
        return load_config(path)
    except ConfigError as exc:
        raise TargetError(str(exc)) from None


def _stage_job_dirs(config: RFTConfig) -> list[Path]:
    from launcher.stages import run_stages  # stages resolve their own job folders

    try:
        return [stage.job_dir for stage in run_stages(config)]
    except ConfigError:
        return [resolve(config).job_dir]


def find_targets(path: Path | None, flags: dict[str, list[str]], auth_token: str | None = None) -> Targets:
    """The services to watch. `flags` maps a kind (buffer, trainer, synchronizer, explorer) to the
    addresses given for it on the command line."""
    config: RFTConfig | None = None
    job_dir: Path | None = None
    if path is not None:
        if path.is_dir():
            job_dir = path
            if (path / "config.yaml").is_file():
                config = _load(path / "config.yaml")
        elif path.is_file():
            config = _load(path)
            candidates = [d for d in _stage_job_dirs(config) if _newest_port_file(d) >= 0]
            if candidates:
                job_dir = max(candidates, key=_newest_port_file)
        else:
            raise TargetError(f"{path}: no such job folder or config file")
    targets: list[Target] = []
    if job_dir is not None:
        targets = _from_run_dir(job_dir)
        source = f"job {job_dir}"
    elif config is not None:
        eps = config.services
        # a port of 0 (any free port) says nothing about where a service listens
        targets = [Target(k, getattr(eps, k).target) for k in (*KINDS, "explorer")
                   if getattr(eps, k).address or getattr(eps, k).port]  # fmt: skip
        source = f"config {path}"
    else:
        source = "flags"
    for kind, addresses in flags.items():
        if not addresses:
            continue
        targets = [t for t in targets if t.kind != kind]
        for i, address in enumerate(addresses):
            name = kind if len(addresses) == 1 else f"{kind}-{i}"
            targets.append(Target(name, address))
    if not targets:
        where = f"{path}: no run/*.port files yet (is `rft run` running?)" if path else "no address given"
        raise TargetError(f"{where}; pass a job folder, a run config, or --buffer/--trainer/"
                          "--synchronizer/--explorer HOST:PORT")  # fmt: skip
    token = auth_token or (config.services.auth_token if config is not None else None)
    token = token or os.environ.get("RFT_AUTH_TOKEN") or None
    return Targets(
        services=_ordered(targets),
        job_dir=job_dir,
        auth_token=token,
        tls=config.services.tls if config is not None else None,
        source=source,
        flag_kinds=frozenset(k for k, v in flags.items() if v),
    )
