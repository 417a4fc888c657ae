"""A Task: one taskset row plus everything a workflow needs to run it (Trinity-RFT's Task).

The row stays raw (`raw`); `format` says which keys hold the prompt, the reference answer, the system
prompt or a whole message list, so a workflow asks `task.messages()` / `task.prompt_text()` /
`task.ground_truth` instead of knowing the file's column names. `sampling` is the taskset's
`SamplingParams`, resolved once from the config.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from services.common.config import FormatConfig
from services.common.sampling import SamplingParams


class BadRow(ValueError):
    """A row that lacks what its format needs; the message names the key."""


@dataclass(frozen=True)
class Task:
    """One unit of exploration. `repeat_times` samples of it form a group (one `group_id`)."""

    task_id: str  # "<taskset>/<row index>", stable across runs and explorers
    index: int  # row index in its taskset (0-based)
    taskset: str
    raw: Mapping[str, Any]
    workflow: str
    repeat_times: int = 1
    format: FormatConfig = field(default_factory=FormatConfig)
    # the taskset's sampling arguments (`Resolved.sampling_params`); None only for a task that never samples
    sampling: SamplingParams | None = None
    workflow_args: Mapping[str, Any] = field(default_factory=dict)
    reward_fn: str | None = None
    reward_fn_args: Mapping[str, Any] = field(default_factory=dict)
    is_eval: bool = False
    epoch: int = 0
    # ReMax: also run the workflow once greedily (temperature 0); its reward is every sample's
    # `reward_baseline` (set by the runner)
    greedy_baseline: bool = False

    @property
    def ground_truth(self) -> Any:
        return self.raw.get(self.format.response_key)

    def prompt_text(self) -> str:
        """The plain prompt (`prompt_key`), with `reply_prefix` appended when set."""
        value = self.raw.get(self.format.prompt_key)
        if value is None:
            raise BadRow(f"missing key {self.format.prompt_key!r}")
        return str(value) + (self.format.reply_prefix or "")

    def system_prompt(self) -> str | None:
        f = self.format
        if f.system_prompt_key and self.raw.get(f.system_prompt_key):
            return str(self.raw[f.system_prompt_key])
        return f.system_prompt

    def messages(self) -> list[dict[str, str]]:
        """Chat messages: the row's `messages_key` list when present, else system + user prompt."""
        f = self.format
        listed = self.raw.get(f.messages_key)
        if listed:
            msgs = [{"role": str(m["role"]), "content": str(m["content"])} for m in listed]
        else:
            value = self.raw.get(f.prompt_key)
            if value is None:
                raise BadRow(f"missing key {f.prompt_key!r} (and no {f.messages_key!r} list)")
            msgs = [{"role": "user", "content": str(value)}]
        system = self.system_prompt()
        if system and not any(m["role"] == "system" for m in msgs):
            msgs.insert(0, {"role": "system", "content": system})
        return msgs


def check_row(raw: Mapping[str, Any], fmt: FormatConfig, needs_response: bool) -> None:
    """Raise BadRow when the row cannot be turned into a prompt (and a reference answer if needed)."""
    has_messages = bool(raw.get(fmt.messages_key))
    if fmt.prompt_type == "messages" and has_messages:
        pass
    elif raw.get(fmt.prompt_key) is None:
        keys = ", ".join(sorted(k for k, v in raw.items() if v is not None)) or "none"
        raise BadRow(f"missing key {fmt.prompt_key!r} (row has: {keys})")
    if needs_response and raw.get(fmt.response_key) is None:
        keys = ", ".join(sorted(k for k, v in raw.items() if v is not None)) or "none"
        raise BadRow(f"missing key {fmt.response_key!r} (row has: {keys})")
