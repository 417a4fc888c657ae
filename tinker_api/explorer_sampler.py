"""Sampling from an explorer in serve mode, on the versions the synchronizer publishes.

`ExplorerSampler` is the `Sampler` of the service-backed mode (`--synchronizer` and `--explorer`). For
the explorer's base model, each save for the sampler is published as the run's next version
(publish.py) and remembered as the version of those weights; a sample waits until the explorer
holds that version (its `/health`, up to `wait_s`) and sends the prompt's token ids to its
`/v1/completions` (`return_token_ids`, `logprobs`, `record: false`: the call opens no session), then
checks that the answer came from that version. A sampling client on weights the explorer no longer
holds (the base model after a publish, an older save, a checkpoint loaded by path) publishes them
again as the next version first: the explorer holds one version at a time. Other base models are
sampled in process, as without the flags (sampling.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import torch

from services.common.backoff import Backoff

from .publish import Publisher
from .sampling import Sampler


class ExplorerError(RuntimeError):
    """The explorer did not answer as a sampler needs (unreachable, timed out, another version)."""


class ExplorerSampler(Sampler):
    """Samples of the explorer's base model from the explorer; the others in process."""

    def __init__(
        self,
        publisher: Publisher,
        url: str,
        base_folder: str,
        *,
        auth_token: str | None = None,
        wait_s: float = 120.0,
        timeout_s: float = 300.0,
    ):
        super().__init__()
        self.publisher, self.base, self.wait_s = publisher, base_folder, wait_s
        self.url = url.rstrip("/").removesuffix("/v1")
        headers = {"Authorization": f"Bearer {auth_token}"} if auth_token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)
        self.version_of: dict[str, int] = {}  # weights key -> the version they were published as
        if publisher.version == 0:
            self.version_of["base"] = 0  # nothing published yet: the explorer holds its base model
        self.last_wait_s = 0.0  # seconds the last sample waited for the explorer to hold its version

    def saved(
        self, base_folder: str, key: str, state: Callable[[], dict[str, torch.Tensor]], named: bool
    ) -> None:
        if base_folder != self.base:
            super().saved(base_folder, key, state, named)
            return
        weights = {k: v.detach().clone().contiguous() for k, v in state().items()}
        if not named:  # kept to publish again if the explorer moves on and this snapshot is sampled
            self.keep(key, weights)
        self.version_of[key] = self.publisher.publish(weights)

    def sample(
        self, base_folder: str, key: str, weights_folder: Path | None, prompt: list[int], n: int, p: Any
    ) -> list[tuple[list[int], list[float], str]]:
        if base_folder != self.base:
            return super().sample(base_folder, key, weights_folder, prompt, n, p)
        version = self.version_of.get(key)
        if version is None or version != self.publisher.version:  # not what the explorer holds
            weights = self.weights(base_folder, key, weights_folder)
            version = self.version_of[key] = self.publisher.publish(weights)
        self.last_wait_s = self.wait_for(version)
        stop = p.stop if p.stop is not None else ()
        stop = [stop] if isinstance(stop, str) else list(stop)
        body: dict[str, Any] = {
            "prompt": prompt, "n": n, "max_tokens": int(p.max_tokens) if p.max_tokens else None,
            "temperature": float(p.temperature), "top_p": float(p.top_p), "top_k": int(p.top_k),
            "stop": [s for s in stop if isinstance(s, str)] or None,
            "stop_token_ids": [s for s in stop if isinstance(s, int)] or None,
            "logprobs": 0, "return_token_ids": True, "record": False,
        }  # fmt: skip
        answer = self._post("/v1/completions", body)
        if int(answer.get("model_version", -1)) != version:
            raise ExplorerError(
                f"the explorer at {self.url} answered with version {answer.get('model_version')}, not "
                f"{version}: another version was published meanwhile; sample again"
            )
        return [
            (list(c["token_ids"]), list(c["logprobs"]["token_logprobs"]), c["finish_reason"])
            for c in answer["choices"]
        ]

    def held(self) -> int:
        """The version the explorer serves now (its `/health`)."""
        try:
            r = self.http.get("/health", timeout=10)
            r.raise_for_status()
            return int(r.json()["model_version"])
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise ExplorerError(f"--explorer {self.url}: /health did not answer ({exc})") from exc

    def wait_for(self, version: int) -> float:
        """Wait until the explorer holds `version`; the seconds waited. Polls `/health` (20 ms
        doubling to 0.5 s) with a deadline `wait_s`."""
        start = time.monotonic()
        backoff = Backoff(first=0.02, most=0.5)
        while True:
            held = self.held()
            if held == version:
                return time.monotonic() - start
            if held > version:
                raise ExplorerError(
                    f"the explorer at {self.url} holds version {held}, newer than {version}: another "
                    "trainer publishes to its synchronizer; rft serve tinker must be the run's only trainer"
                )
            if time.monotonic() - start > self.wait_s:
                raise ExplorerError(
                    f"the explorer at {self.url} still holds version {held} after {self.wait_s:g} s, waiting "
                    f"for version {version} (published by save_weights_for_sampler): is it in mode serve, "
                    "following the same synchronizer? (--explorer-wait sets the wait)"
                )
            # polling /health, with a deadline
            backoff.wait_blocking(self.wait_s - (time.monotonic() - start))

    def _post(self, route: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            r = self.http.post(route, json=body)
        except httpx.HTTPError as exc:
            raise ExplorerError(f"--explorer {self.url}{route}: {type(exc).__name__}: {exc}") from exc
        if r.status_code >= 400:
            try:
                message = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = r.text[:500]
            err = ValueError if r.status_code < 500 else ExplorerError  # ValueError: the client's to change
            raise err(f"the explorer refused the sample ({r.status_code}): {message}")
        return r.json()

    def close(self) -> None:
        self.http.close()
        self.publisher.close()
