"""The state behind the Tinker routes: base models, sessions, training models, sampling sessions.

Base model names resolve to local folders (a folder path is accepted as is); checkpoints are
`tinker://<model_id>/<weights|sampler_weights>/<name>`, folders under the checkpoint directory.
The methods here run as queued work (futures.py); a `UserError` is a request the client must change.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from . import wire
from .futures import Futures
from .sampling import Sampler
from .training import TrainingModel


class UserError(ValueError):
    """A request the client must change (the SDK shows the message)."""


class TinkerServer:
    """The state behind the routes: base models, sessions, training models and sampling sessions."""

    def __init__(
        self,
        base_models: dict[str, str],
        checkpoint_dir: Path,
        api_key: str | None = None,
        full: frozenset[str] = frozenset(),
    ):
        self.base_models = base_models
        self.full = full  # base model names trained in full: a client's LoRA rank is then ignored
        self.checkpoint_dir = checkpoint_dir
        self.api_key = api_key
        self.futures = Futures()
        self.sampler = Sampler()
        self.sessions: dict[str, int] = {}
        self.models: dict[str, TrainingModel] = {}
        self.sampling: dict[str, tuple[str, str, Path | None]] = {}
        self.sampler_info: dict[str, dict[str, Any]] = {}  # GET /samplers/<id>

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
        return self.models[model_id]

    def path(self, tinker_path: str) -> tuple[str, Path]:
        """`tinker://<model_id>/<kind>/<name>` -> (model_id, its folder under the checkpoint dir)."""
        parts = tinker_path.removeprefix("tinker://").split("/")
        if not tinker_path.startswith("tinker://") or len(parts) != 3 or not all(parts):
            raise UserError(
                f"path {tinker_path!r}: expected tinker://<model_id>/<weights|sampler_weights>/<name>"
            )
        folder = self.checkpoint_dir.joinpath(*parts)
        if not folder.is_dir():
            raise UserError(f"no checkpoint at {tinker_path} ({folder} is missing)")
        return parts[0], folder

    # ---- queued work
    def create_model(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("session_id") not in self.sessions:
            raise UserError(f"unknown session_id {body.get('session_id')!r}")
        folder = self.folder(body["base_model"])
        lora = body.get("lora_config") or None
        model_id = f"{body['session_id']}:train:{int(body.get('model_seq_id') or 0)}"  # the SDK's own form
        if model_id in self.models:
            raise UserError(f"model {model_id} already exists in this session")
        rank = int(lora["rank"]) if lora and body["base_model"] not in self.full else None
        seed = int(lora.get("seed") or 0) if lora else 0
        self.models[model_id] = TrainingModel(model_id, body["base_model"], folder, rank, seed)
        return {"model_id": model_id, "type": "create_model"}

    def save(self, body: dict[str, Any], kind: str) -> dict[str, Any]:
        model = self.model(body["model_id"])
        name = body.get("path")
        if kind == "sampler_weights" and not name:  # an ephemeral snapshot for a sampling client
            key = f"snapshot-{uuid.uuid4().hex[:8]}"
            self.sampler.keep(key, {k: v.clone() for k, v in model.full_state().items()})
            sid = f"sampling-{uuid.uuid4().hex[:12]}"
            self.sampling[sid] = (model.folder, key, None)
            self.sampler_info[sid] = {"sampler_id": sid, "base_model": model.base_model, "model_path": None}
            return {"path": None, "sampling_session_id": sid, "type": "save_weights_for_sampler"}
        name = name or f"step-{model.step:06d}"
        if "/" in name:
            raise UserError(f"path {name!r}: a checkpoint name, without '/'")
        folder = self.checkpoint_dir / model.model_id / kind / name
        model.save(folder, with_optimizer=kind == "weights")
        path = f"tinker://{model.model_id}/{kind}/{name}"
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


class _Params:
    def __init__(self, d: dict[str, Any]):
        self.max_tokens, self.seed, self.stop = d.get("max_tokens"), d.get("seed"), d.get("stop")
        self.temperature, self.top_k, self.top_p = (
            d.get("temperature", 1.0),
            d.get("top_k", -1),
            d.get("top_p", 1.0),
        )
