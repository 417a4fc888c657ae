"""Offline experiences for a `train`-mode stage (SFT warm-up, as Trinity-RFT's `sft` with a file
experience buffer): rows of `buffer.trainer_input.experience_buffer.path` become Experiences that
`rft run` puts into the stage's buffer, where the trainer leases them as it would rollouts.

A row holds a prompt and its target response under the buffer's `format` keys (`prompt_key`,
`response_key`; `prompt_type: plaintext` or `messages`, rendered with the model's chat template).
Tokens are made exactly as the explorer makes them, so the warm-up teaches what RL later samples:
prompt ids without special tokens, then the response ids and EOS. Each row is its own group.
Enough epochs are fed to cover `total_steps` x `train_batch_size` rows (or `total_epochs`); a full
buffer (RESOURCE_EXHAUSTED) is waited out, so a large file streams in as the trainer consumes it.

For a pairwise loss (DPO) a row holds a prompt and two responses under `chosen_key` and
`rejected_key`; it becomes one pair experience (`tokens` = prompt + chosen, `rejected_tokens` =
prompt + rejected), so the buffer hands a pair out whole and the trainer expands it into two rows.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import grpc
import torch

from services.common.buffer_client import BufferClient
from services.common.config import FormatConfig, RFTConfig, resolve
from services.common.data_files import DataFileError, load_data
from services.common.experience import Experience, ExperienceId
from services.common.modeling import load_tokenizer
from services.common.rpc import create_channel

CHUNK = 256  # experiences per put


class OfflineDataError(ValueError):
    """The offline data file cannot be turned into experiences (names the file and the row)."""


def load_rows(path: str, split: str = "train") -> list[dict[str, Any]]:
    """Rows of a jsonl/json/parquet/csv file or a `datasets` folder (the same reader as tasksets,
    `services.common.data_files`; a jsonl/json file reads without `datasets` where it is not installed)."""
    try:
        return [dict(r) for r in load_data(path, split, what="offline data")]
    except DataFileError as exc:
        raise OfflineDataError(str(exc)) from None


def _text(value: Any) -> str:
    """A response as text: a string, or the content of the last message of a message list."""
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        return str(value[-1].get("content", ""))
    return str(value)


def build_experiences(
    rows: Sequence[dict[str, Any]], tokenizer: Any, fmt: FormatConfig, source: str = "", pairs: bool = False
) -> list[Experience]:
    """One Experience per row: prompt tokens + response tokens + EOS, reward 0, version 0; with
    `pairs`, the chosen response in `tokens` and the rejected one in `rejected_tokens`."""
    eos = tokenizer.eos_token_id
    keys = (fmt.chosen_key, fmt.rejected_key) if pairs else (fmt.response_key,)
    out = []
    for i, row in enumerate(rows):
        if fmt.prompt_key not in row or any(k not in row for k in keys):
            raise OfflineDataError(
                f"{source} row {i + 1}: needs keys {', '.join(map(repr, (fmt.prompt_key, *keys)))} "
                f"(buffer.trainer_input.experience_buffer.format); it has {sorted(row)}"
            )
        prompt = str(row[fmt.prompt_key])
        if fmt.prompt_type == "messages":
            messages = [{"role": "user", "content": prompt}]
            system = fmt.system_prompt or (row.get(fmt.system_prompt_key) if fmt.system_prompt_key else None)
            if system:
                messages.insert(0, {"role": "system", "content": str(system)})
            prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt += fmt.reply_prefix or ""
        p_ids = list(tokenizer.encode(prompt, add_special_tokens=False))
        responses = []
        for key in keys:
            r_ids = list(tokenizer.encode(_text(row[key]), add_special_tokens=False))
            if eos is not None:
                r_ids.append(int(eos))
            if not r_ids:
                raise OfflineDataError(f"{source} row {i + 1}: empty response under {key!r}")
            responses.append(r_ids)
        r_ids = responses[0]
        exp = Experience(
            tokens=p_ids + r_ids,
            prompt_length=len(p_ids),
            logprobs=[0.0] * len(r_ids),
            action_mask=[True] * len(r_ids),
            reward=0.0,
            prompt_text=prompt,
            response_text=_text(row[keys[0]]),
        )
        if pairs:
            exp.rejected_tokens = torch.tensor(p_ids + responses[1], dtype=torch.int64)
            exp.rejected_prompt_length = len(p_ids)
        out.append(exp)
    return out


def epochs_needed(config: RFTConfig, rows: int) -> int:
    """Epochs of the file that cover the stage's training."""
    total = resolve(config).total_steps
    if total is None or rows == 0:
        return config.buffer.total_epochs
    return max(1, math.ceil(total * resolve(config).train_batch_size / rows))


async def _put(client: BufferClient, batch: list[Experience], vocab: int, stop: asyncio.Event) -> None:
    while True:
        try:
            await client.put(batch, vocab_size=vocab)
            return
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise  # (a refused put stored nothing; the next one takes a new sequence number)
        try:  # full: wait for the trainer to consume
            await asyncio.wait_for(stop.wait(), timeout=0.5)
            return
        except asyncio.TimeoutError:
            pass


async def feed(config: RFTConfig, buffer_address: str, stop: asyncio.Event, auth_token: str | None) -> int:
    """Put the stage's offline data into the buffer at `buffer_address`; returns experiences put."""
    eb = config.buffer.trainer_input.experience_buffer
    assert eb.path, "feed() needs buffer.trainer_input.experience_buffer.path"
    rows = await asyncio.to_thread(load_rows, eb.path, eb.split)
    tokenizer = await asyncio.to_thread(load_tokenizer, config.model.model_path)
    experiences = build_experiences(
        rows, tokenizer, eb.format, source=eb.path, pairs=config.algorithm.pairwise
    )
    svc = config.services
    channel = create_channel(buffer_address, auth_token=auth_token, tls=svc.tls, timeout_s=svc.rpc_timeout)
    client = BufferClient(channel, producer_id=f"{config.name}-offline", timeout_s=svc.rpc_timeout)
    vocab = len(tokenizer)
    sent = 0
    try:
        for epoch in range(epochs_needed(config, len(experiences))):
            for start in range(0, len(experiences), CHUNK):
                batch = []
                for j, exp in enumerate(experiences[start : start + CHUNK]):
                    exp.eid = ExperienceId(batch_id=f"e{epoch}", task_id=str(start + j),
                                           group_id=f"offline/e{epoch}/{start + j}", explorer_id="offline")  # fmt: skip
                    batch.append(exp)
                if stop.is_set():
                    return sent
                await _put(client, batch, vocab, stop)
                sent += len(batch)
    finally:
        await channel.close()
    return sent
