"""The state behind the Tinker routes: base models, sessions, training models, sampling sessions.

Base model names resolve to local folders (a folder path is accepted as is); checkpoints are
`tinker://<model_id>/<weights|sampler_weights>/<name>`, folders under the checkpoint directory.
The methods here run as queued work (futures.py); a `UserError` is a request the client must change.
A training run (the REST client's view) is a training client's model id: the ones this process made
and the ones with checkpoints left in the checkpoint directory by an earlier run of the server.
"""

from __future__ import annotations

import shutil
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import expiry, wire
from .futures import Futures
from .sampling import Sampler
from .sessions import Sessions
from .training import TrainingModel

OWNER = "rft"  # the `model_owner` of every training run: one API key, one owner
KINDS = {"weights": "training", "sampler_weights": "sampler"}  # path segment -> Tinker checkpoint_type


class UserError(ValueError):
    """A request the client must change (the SDK shows the message)."""


class NotFound(UserError):
    """An unknown training run or checkpoint (a 404 for the REST routes)."""


class TinkerServer:
    """The state behind the routes: base models, sessions, training models and sampling sessions."""

    def __init__(
        self,
        base_models: dict[str, str],
        checkpoint_dir: Path,
        api_key: str | None = None,
        full: frozenset[str] = frozenset(),
        sampler: Sampler | None = None,
    ):
        self.base_models = base_models
        self.full = full  # base model names trained in full: a client's LoRA rank is then ignored
        self.checkpoint_dir = checkpoint_dir
        self.api_key = api_key
        self.futures = Futures()
        self.sampler = sampler or Sampler()  # explorer_sampler.ExplorerSampler: the service-backed mode
        self.sessions = Sessions()
        self.models: dict[str, TrainingModel] = {}
        self.sampling: dict[str, tuple[str, str, Path | None]] = {}
        self.sampler_info: dict[str, dict[str, Any]] = {}  # GET /samplers/<id>
        self.last_request: dict[str, float] = {}  # model_id -> time of its last request

    def folder(self, base_model: str) -> str:
        if base_model in self.base_models:
            return self.base_models[base_model]
        if (Path(base_model) / "config.json").is_file():
            return str(Path(base_model).resolve())
        raise UserError(
            f"base_model {base_model!r} is neither a served name ({', '.join(self.base_models)}) nor a local "
            "model folder with a config.json"
        )

    def model(self, model_id: str) -> TrainingModel:
        if model_id not in self.models:
            raise UserError(f"unknown model_id {model_id!r}; create a training client first")
        self.last_request[model_id] = time.time()
        return self.models[model_id]

    def path(self, tinker_path: str) -> tuple[str, Path]:
        """`tinker://<model_id>/<kind>/<name>` -> (model_id, its folder under the checkpoint dir)."""
        parts = tinker_path.removeprefix("tinker://").split("/")
        if not tinker_path.startswith("tinker://") or len(parts) != 3 or not all(parts):
            raise UserError(
                f"path {tinker_path!r}: expected tinker://<model_id>/<weights|sampler_weights>/<name>"
            )
        folder = self.checkpoint_dir.joinpath(*parts)
        if folder.is_dir() and expiry.expired(folder):  # its TTL ran out: gone, as if deleted
            shutil.rmtree(folder)
        if not folder.is_dir():
            raise UserError(f"no checkpoint at {tinker_path} ({folder} is missing)")
        return parts[0], folder

    # ---- queued work
    def create_model(self, body: dict[str, Any]) -> dict[str, Any]:
        self.sessions.live(body.get("session_id"))  # unknown or finished: a SessionError
        folder = self.folder(body["base_model"])
        lora = body.get("lora_config") or None
        model_id = f"{body['session_id']}:train:{int(body.get('model_seq_id') or 0)}"  # the SDK's own form
        if model_id in self.models:
            raise UserError(f"model {model_id} already exists in this session")
        rank = int(lora["rank"]) if lora and body["base_model"] not in self.full else None
        seed = int(lora.get("seed") or 0) if lora else 0
        self.models[model_id] = TrainingModel(model_id, body["base_model"], folder, rank, seed)
        self.last_request[model_id] = time.time()
        return {"model_id": model_id, "type": "create_model"}

    def save(self, body: dict[str, Any], kind: str) -> dict[str, Any]:
        model = self.model(body["model_id"])
        name = body.get("path")
        if kind == "sampler_weights" and not name:  # an ephemeral snapshot for a sampling client
            key = f"snapshot-{uuid.uuid4().hex[:8]}"
            self.sampler.saved(model.folder, key, model.full_state, named=False)
            sid = f"sampling-{uuid.uuid4().hex[:12]}"
            self.sampling[sid] = (model.folder, key, None)
            self.sampler_info[sid] = {"sampler_id": sid, "base_model": model.base_model, "model_path": None}
            return {"path": None, "sampling_session_id": sid, "type": "save_weights_for_sampler"}
        name = name or f"step-{model.step:06d}"
        if "/" in name:
            raise UserError(f"path {name!r}: a checkpoint name, without '/'")
        folder = self.checkpoint_dir / model.model_id / kind / name
        expiry.check_ttl(body.get("ttl_seconds"))
        model.save(folder, with_optimizer=kind == "weights")
        expiry.set_ttl(folder, body.get("ttl_seconds"))
        path = f"tinker://{model.model_id}/{kind}/{name}"
        if kind == "sampler_weights":
            self.sampler.saved(model.folder, path, model.full_state, named=True)
        return {"path": path, "type": "save_weights" if kind == "weights" else "save_weights_for_sampler"}

    def load(self, body: dict[str, Any]) -> dict[str, Any]:
        _, folder = self.path(body["path"])
        model_id = body.get("model_id")
        if model_id is None:  # a new training client from the checkpoint (create_training_client_from_state)
            base, rank = TrainingModel.describe(folder)
            lora = {"rank": rank} if rank else None
            create = {
                "session_id": body.get("session_id"),
                "model_seq_id": body.get("model_seq_id"),
                "base_model": body.get("base_model") or base,
            }
            model_id = self.create_model({**create, "lora_config": lora})["model_id"]
        self.model(model_id).load(folder, with_optimizer=bool(body.get("optimizer")))
        return {"path": body["path"], "model_id": model_id, "type": "load_weights"}

    # ---- training runs and their checkpoints (the REST client's routes, answered at once)
    def checkpoints(self, run_id: str) -> list[dict[str, Any]]:
        """The run's saved checkpoints as Tinker `Checkpoint`s, oldest first; NotFound for no such run."""
        run = self.checkpoint_dir / run_id
        if run_id not in self.models and (run_id in ("", ".", "..") or "/" in run_id or not run.is_dir()):
            raise NotFound(
                f"unknown training run {run_id!r}: no training client and no checkpoints by that id"
            )
        out = []
        for seg, kind in KINDS.items():
            for folder in sorted(p for p in (run / seg).glob("*") if (p / "trainer.pt").is_file()):
                if expiry.expired(folder):
                    shutil.rmtree(folder)
                    continue
                expires = expiry.expires_at(folder)
                out.append(
                    {
                        "checkpoint_id": f"{seg}/{folder.name}",
                        "checkpoint_type": kind,
                        "time": _iso((folder / "trainer.pt").stat().st_mtime),
                        "tinker_path": f"tinker://{run_id}/{seg}/{folder.name}",
                        "size_bytes": sum(f.stat().st_size for f in folder.iterdir() if f.is_file()),
                        "expires_at": None if expires is None else _iso(expires),
                    }
                )
        return sorted(out, key=lambda c: c["time"])

    def training_run(self, run_id: str) -> dict[str, Any]:
        """One Tinker `TrainingRun`: base model, LoRA rank, last request, newest checkpoints."""
        ckpts = self.checkpoints(run_id)
        if run_id in self.models:
            model = self.models[run_id]
            base, rank, last = model.base_model, model.lora_rank, _iso(self.last_request[run_id])
        elif ckpts:  # a run of an earlier server process: described by its newest checkpoint
            base, rank = TrainingModel.describe(self.path(ckpts[-1]["tinker_path"])[1])
            last = ckpts[-1]["time"]
        else:
            raise NotFound(f"training run {run_id!r} has no training client and no checkpoints left")
        newest = {c["checkpoint_type"]: c for c in ckpts}
        return {
            "training_run_id": run_id,
            "base_model": base,
            "model_owner": OWNER,
            "is_lora": bool(rank),
            "lora_rank": rank,
            "corrupted": False,
            "last_request_time": last,
            "last_checkpoint": newest.get("training"),
            "last_sampler_checkpoint": newest.get("sampler"),
        }

    def _run_ids(self) -> set[str]:
        """This process's training clients and the runs with a folder in the checkpoint directory."""
        ids = set(self.models)
        if self.checkpoint_dir.is_dir():
            ids |= {p.name for p in self.checkpoint_dir.iterdir() if p.is_dir()}
        return ids

    def user_checkpoints(self, limit: int, offset: int) -> dict[str, Any]:
        """A page of every run's checkpoints, the newest first, with Tinker's cursor."""
        found = []
        for run_id in self._run_ids():
            found += self.checkpoints(run_id)
        found.sort(key=lambda c: c["time"], reverse=True)
        page = found[offset : offset + limit] if limit > 0 else []
        return {"checkpoints": page, "cursor": {"offset": offset, "limit": limit, "total_count": len(found)}}

    def training_runs(self, limit: int, offset: int) -> dict[str, Any]:
        """A page of runs, the most recently used first, with Tinker's cursor."""
        runs = []
        for run_id in self._run_ids():
            try:
                runs.append(self.training_run(run_id))
            except NotFound:  # a folder whose checkpoints were all deleted
                continue
        runs.sort(key=lambda r: r["last_request_time"], reverse=True)
        page = runs[offset : offset + limit] if limit > 0 else []
        return {"training_runs": page, "cursor": {"offset": offset, "limit": limit, "total_count": len(runs)}}

    def delete_checkpoint(self, run_id: str, checkpoint_id: str) -> None:
        """Remove a saved checkpoint's folder; loading it afterwards is the usual "no checkpoint" error."""
        path = f"tinker://{run_id}/{checkpoint_id}"
        seg = checkpoint_id.split("/")[0]
        if seg not in KINDS:
            raise NotFound(f"checkpoint {checkpoint_id!r}: expected weights/<name> or sampler_weights/<name>")
        try:
            _, folder = self.path(path)
        except UserError as exc:
            raise NotFound(str(exc)) from exc
        shutil.rmtree(folder)

    def set_ttl(self, run_id: str, checkpoint_id: str, ttl_seconds: int | None) -> None:
        """`set_checkpoint_ttl`: expire the checkpoint `ttl_seconds` from now (None: never)."""
        try:
            _, folder = self.path(f"tinker://{run_id}/{checkpoint_id}")
        except UserError as exc:
            raise NotFound(str(exc)) from exc
        expiry.set_ttl(folder, ttl_seconds)

    def weights_info(self, tinker_path: str) -> dict[str, Any]:
        """Base model and LoRA rank of a saved checkpoint (the SDK's `WeightsInfoResponse`)."""
        try:
            _, folder = self.path(tinker_path)
        except UserError as exc:
            raise NotFound(str(exc)) from exc
        base, rank = TrainingModel.describe(folder)
        return {"base_model": base, "is_lora": bool(rank), "lora_rank": rank}

    def sample(self, body: dict[str, Any]) -> bytes:
        sid = body.get("sampling_session_id")
        if sid:
            if sid not in self.sampling:
                raise UserError(f"unknown sampling_session_id {sid!r}")
            base, key, wfolder = self.sampling[sid]
        else:
            base, key, wfolder = self._sampling_target(body.get("base_model"), body.get("model_path"))
        tokens = [t for c in body["prompt"]["chunks"] for t in c.get("tokens", [])]
        if not tokens:
            raise UserError("asample: the prompt has no tokens")
        params = _Params(body.get("sampling_params") or {})
        return wire.sample_response(
            self.sampler.sample(base, key, wfolder, tokens, int(body.get("num_samples", 1)), params)
        )

    def open_sampling(self, base_model: str | None, model_path: str | None) -> str:
        target = self._sampling_target(base_model, model_path)
        sid = f"sampling-{uuid.uuid4().hex[:12]}"
        self.sampling[sid] = target
        name = base_model or TrainingModel.describe(target[2])[0]
        self.sampler_info[sid] = {"sampler_id": sid, "base_model": name, "model_path": model_path}
        return sid

    def _sampling_target(
        self, base_model: str | None, model_path: str | None
    ) -> tuple[str, str, Path | None]:
        if model_path:
            _, folder = self.path(model_path)
            base, _ = TrainingModel.describe(folder)
            return self.folder(base), model_path, folder
        if base_model:
            return self.folder(base_model), "base", None
        raise UserError("a sampling session needs base_model or model_path")


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat()


class _Params:
    def __init__(self, d: dict[str, Any]):
        self.max_tokens, self.seed, self.stop = d.get("max_tokens"), d.get("seed"), d.get("stop")
        self.temperature, self.top_k, self.top_p = (
            d.get("temperature", 1.0),
            d.get("top_k", -1),
            d.get("top_p", 1.0),
        )
