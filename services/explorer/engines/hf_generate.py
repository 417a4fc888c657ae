"""The `hf` engine's sampling loop: batched, left-padded, KV-cached, written over `model(...)`.

Why our own loop instead of `model.generate`: the log-probs must be exactly those of the sampling
distribution (see `sampling.py`), every row may carry its own sampling arguments, and rows that finish
(EOS, a stop token or string, their own `max_tokens`) leave the batch at once, so later steps run on
the rows still going. Prompts are sorted by length before they are cut into micro-batches
(`micro_batch_size` rows per forward pass, bounding memory), which keeps left padding small.
Per step the work is tensor ops; Python touches single rows only to check stop strings.  For
Llama-family models the per-token forward is `lean_decoder.LeanDecoder` (same weights, far less
Python per call); other models use the transformers forward with its `DynamicCache`.

In-flight weight updates: `between_steps`, when set, is called before every forward pass; when it
returns True the weights have just changed (the engine loaded a new version into the same modules),
so the KV cache of the rows still going is rebuilt from their prompt and the tokens sampled so far
with the new weights, and the next tokens are what the new weights sample from that prefix. Each
sampled token records `version` as it was for that step (`GenerationOutput.token_model_versions`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from services.common import progress
from services.explorer.engines.base import GenerationOutput, SamplingParams
from services.explorer.engines.lean_decoder import LeanDecoder, unsupported
from services.explorer.engines.sampling import RowParams, apply_repetition_penalty, sample_dist


@dataclass
class Row:
    """One sample to generate: prompt token ids and its sampling arguments.

    `on_token(token_id, logprob, top)`, when set, is called from the generating thread after each step
    in which this row sampled a token (streaming); `top` is that token's top-k list (below) or None. `top_logprobs` > 0 records, per sampled token, the k
    most likely tokens of the same sampling distribution (`GenerationOutput.top_logprobs`)."""

    prompt: list[int]
    params: SamplingParams
    on_token: Callable[[int, float, list[tuple[int, float]] | None], None] | None = None
    top_logprobs: int = 0


class HFGenerator:
    """Synchronous generation with a transformers causal LM. Not thread-safe: one call at a time."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: object,
        *,
        micro_batch_size: int = 64,
        seed: int = 42,
        eos_token_ids: Sequence[int] = (),
        pad_token_id: int = 0,
        lean_decoder: bool = True,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.micro_batch_size = micro_batch_size
        self.device = next(model.parameters()).device
        self.eos_token_ids = tuple(eos_token_ids)
        self.pad_token_id = pad_token_id
        reason = unsupported(model) if lean_decoder else "lean_decoder is off"
        self.lean = LeanDecoder(model) if reason is None else None
        self.lean_off_reason = reason
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        # in-flight weight updates (module docstring): the weights' version, the hook, per-token record
        self.version = 0
        self.between_steps: Callable[[], bool] | None = None
        self.record_versions = False

    def reseed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    @torch.inference_mode()
    def generate(self, rows: Sequence[Row]) -> list[GenerationOutput]:
        """Outputs in the order of `rows`."""
        order = sorted(range(len(rows)), key=lambda i: len(rows[i].prompt))
        out: list[GenerationOutput | None] = [None] * len(rows)
        for start in range(0, len(order), self.micro_batch_size):
            chunk = order[start : start + self.micro_batch_size]
            for i, result in zip(chunk, self._micro_batch([rows[i] for i in chunk]), strict=True):
                out[i] = result
        return out  # type: ignore[return-value]

    def _left_padded(self, rows: Sequence[Row]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The prompts right-aligned in one (rows, width) batch: token ids, key mask, positions."""
        batch, width = len(rows), max(len(r.prompt) for r in rows)
        ids = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
        # the lean forward takes a boolean key mask; transformers takes 0/1 integers
        mask = torch.zeros((batch, width), dtype=torch.bool if self.lean is not None else torch.long)
        for i, r in enumerate(rows):
            if r.prompt:
                ids[i, width - len(r.prompt) :] = torch.tensor(r.prompt, dtype=torch.long)
                mask[i, width - len(r.prompt) :] = True
        ids, mask = ids.to(self.device), mask.to(self.device)
        return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)

    def _next_logits(self, step_ids: torch.Tensor, step_pos: torch.Tensor, mask: torch.Tensor, cache: Any):
        """The last position's logits of one decoding step (the lean forward or transformers')."""
        if self.lean is not None:
            return self.lean.forward(step_ids, step_pos, mask, cache)
        return self.model(
            input_ids=step_ids,
            attention_mask=mask,
            position_ids=step_pos,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1, :]

    @staticmethod
    def _block_early_stops(
        logits: torch.Tensor, stop_ids: torch.Tensor, min_len: torch.Tensor, active: torch.Tensor, t: int
    ) -> torch.Tensor:
        """No stop before min_tokens (vLLM): stop ids of rows still short get no mass."""
        ids_now = stop_ids[active]
        vocab = logits.shape[-1]
        short = (t < min_len[active]).unsqueeze(-1).expand_as(ids_now)
        blocked = torch.zeros((logits.shape[0], vocab + 1), dtype=torch.bool, device=logits.device)
        blocked.scatter_(-1, torch.where(ids_now >= 0, ids_now, vocab), short)  # -1 -> spare column
        return logits.masked_fill(blocked[:, :vocab], float("-inf"))

    def _micro_batch(self, rows: Sequence[Row]) -> list[GenerationOutput]:
        device, batch = self.device, len(rows)
        ids, mask, positions = self._left_padded(rows)
        width = ids.shape[1]

        params = [r.params for r in rows]
        row_params = RowParams.build(params, device)
        max_new = max(p.max_tokens for p in params)
        limit = torch.tensor([p.max_tokens for p in params], device=device)
        min_len = torch.tensor([p.min_tokens for p in params], device=device)
        max_min_len = max(p.min_tokens for p in params)
        stop_ids = self._stop_id_table(params, device)
        stop_strings = {i: p.stop for i, p in enumerate(params) if p.stop}
        penalty, seen = self._repetition_state(rows, params, device)
        callbacks = {i: r.on_token for i, r in enumerate(rows) if r.on_token is not None}
        top_k = {i: r.top_logprobs for i, r in enumerate(rows) if r.top_logprobs > 0}
        top_rec: dict[int, list[list[tuple[int, float]]]] = {i: [] for i in top_k}
        k_max = max(top_k.values(), default=0)

        tokens = torch.full((batch, max_new), self.pad_token_id, dtype=torch.long, device=device)
        logprobs = torch.zeros((batch, max_new), dtype=torch.float32, device=device)
        versions = (
            torch.zeros((batch, max_new), dtype=torch.long, device=device) if self.record_versions else None
        )
        hook = self.between_steps
        lengths = torch.zeros(batch, dtype=torch.long, device=device)
        reason_stop = torch.zeros(batch, dtype=torch.bool, device=device)
        stop_cut: dict[int, int] = {}  # row -> text length before its stop string

        active = torch.arange(batch, device=device)  # original row of each batch position
        lean = self.lean
        cache = lean.new_cache(batch, width + max_new) if lean is not None else DynamicCache()
        step_ids, step_pos = ids, positions
        for t in range(max_new):
            progress.moved()  # the generate call moves (services/common/progress.py)
            if hook is not None and hook() and t > 0:  # new weights: re-read the prefix with them
                cache, step_ids, step_pos = self._reprefill(ids, tokens, active, mask, t, width + max_new)
            if versions is not None:
                versions[active, t] = self.version
            logits = self._next_logits(step_ids, step_pos, mask, cache)
            if stop_ids is not None and t < max_min_len:
                logits = self._block_early_stops(logits, stop_ids, min_len, active, t)
            if penalty is not None:
                logits = apply_repetition_penalty(logits, seen[active], penalty[active])
            tok, lp, dist = sample_dist(logits, row_params, self.generator)
            if top_k:
                self._record_top(dist, active, top_k, k_max, top_rec)
            if callbacks:
                self._call_back(callbacks, active, tok, lp, top_rec)
            if seen is not None:
                seen[active, tok] = True
            tokens[active, t] = tok
            logprobs[active, t] = lp
            lengths[active] = t + 1
            done = lengths[active] >= limit[active]
            if stop_ids is not None:
                hit = (stop_ids[active] == tok.unsqueeze(-1)).any(-1) & (t + 1 >= min_len[active])
                reason_stop[active] |= hit
                done |= hit
            if stop_strings:
                done |= self._check_stop_strings(tokens, active, t, stop_strings, stop_cut, reason_stop)
            if bool(done.all()):
                break
            step_pos = step_pos[:, -1:] + 1
            if bool(done.any()):
                keep = (~done).nonzero().squeeze(-1)
                active, mask, step_pos, tok = active[keep], mask[keep], step_pos[keep], tok[keep]
                row_params = row_params.select(keep)
                if lean is not None:
                    cache.select(keep)
                else:
                    cache.batch_select_indices(keep)
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
            step_ids = tok.unsqueeze(-1)
        outs = self._outputs(rows, tokens, logprobs, lengths, reason_stop, stop_cut)
        return self._with_extras(outs, top_rec, versions)

    @staticmethod
    def _with_extras(
        outs: list[GenerationOutput], top_rec: dict[int, list[list[tuple[int, float]]]], versions: Any
    ) -> list[GenerationOutput]:
        """The outputs with each row's top-k log-probs and per-token model versions, where recorded."""
        for i, rec in top_rec.items():
            outs[i].top_logprobs = rec
        if versions is not None:
            per_row = versions.cpu().tolist()
            for i, out in enumerate(outs):
                out.token_model_versions = per_row[i][: len(out.token_ids)]
        return outs

    def _reprefill(
        self,
        ids: torch.Tensor,
        tokens: torch.Tensor,
        active: torch.Tensor,
        mask: torch.Tensor,
        t: int,
        capacity: int,
    ) -> tuple[object, torch.Tensor, torch.Tensor]:
        """A fresh cache and the inputs of step `t` that fill it: the rows still going, their left-padded
        prompt `ids` (B, W) then their `t` sampled tokens, at the positions `mask` (b, W + t) gives."""
        full = torch.cat([ids[active], tokens[active, :t]], dim=-1)
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        cache = self.lean.new_cache(len(active), capacity) if self.lean is not None else DynamicCache()
        return cache, full, positions

    @staticmethod
    def _record_top(
        dist: torch.Tensor,
        active: torch.Tensor,
        top_k: dict[int, int],
        k_max: int,
        top_rec: dict[int, list[list[tuple[int, float]]]],
    ) -> None:
        """Append the k most likely (token, log-prob) of this step's distribution for rows that ask."""
        active_list = active.tolist()
        pos = [p for p, row in enumerate(active_list) if row in top_k]
        if not pos:
            return
        values, index = dist[pos].topk(min(k_max, dist.shape[-1]), dim=-1)
        for p, vals, idx in zip(pos, values.tolist(), index.tolist(), strict=True):
            k = top_k[active_list[p]]
            top_rec[active_list[p]].append(list(zip(idx[:k], vals[:k], strict=True)))

    @staticmethod
    def _call_back(
        callbacks: dict[int, Callable[[int, float, list[tuple[int, float]] | None], None]],
        active: torch.Tensor,
        tok: torch.Tensor,
        lp: torch.Tensor,
        top_rec: dict[int, list[list[tuple[int, float]]]],
    ) -> None:
        for row, t, x in zip(active.tolist(), tok.tolist(), lp.tolist(), strict=True):
            fn = callbacks.get(row)
            if fn is not None:
                fn(t, x, top_rec[row][-1] if row in top_rec else None)

    def _repetition_state(
        self, rows: Sequence[Row], params: Sequence[SamplingParams], device: torch.device
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(penalty (B,), seen (B, V) bool: the prompt's tokens) when some row has a repetition penalty."""
        if all(p.repetition_penalty == 1.0 for p in params):
            return None, None
        head = self.model.get_output_embeddings()
        vocab = int(head.weight.shape[0]) if head is not None else int(self.model.config.vocab_size)
        seen = torch.zeros((len(rows), vocab), dtype=torch.bool, device=device)
        for i, r in enumerate(rows):
            if r.prompt:
                seen[i, torch.tensor(r.prompt, dtype=torch.long, device=device)] = True
        penalty = torch.tensor([p.repetition_penalty for p in params], dtype=torch.float32, device=device)
        return penalty, seen

    def _stop_id_table(self, params: Sequence[SamplingParams], device: torch.device) -> torch.Tensor | None:
        """(B, S) ids that end each row (EOS unless ignore_eos, plus stop_token_ids), -1 padded."""
        per_row = [
            list(p.stop_token_ids) + ([] if p.ignore_eos else list(self.eos_token_ids)) for p in params
        ]
        width = max(len(r) for r in per_row)
        if width == 0:
            return None
        table = torch.full((len(params), width), -1, dtype=torch.long)
        for i, r in enumerate(per_row):
            table[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        return table.to(device)

    def _check_stop_strings(
        self,
        tokens: torch.Tensor,
        active: torch.Tensor,
        t: int,
        stops: dict[int, tuple[str, ...]],
        stop_cut: dict[int, int],
        reason_stop: torch.Tensor,
    ) -> torch.Tensor:
        """Decode only rows that have stop strings; mark those whose text now contains one."""
        done = torch.zeros(len(active), dtype=torch.bool, device=active.device)
        active_list = active.tolist()
        for pos, row in enumerate(active_list):
            if row not in stops or row in stop_cut:
                continue
            text = self.tokenizer.decode(tokens[row, : t + 1].tolist(), skip_special_tokens=True)
            cuts = [text.find(s) for s in stops[row] if s and s in text]
            if cuts:
                stop_cut[row] = min(cuts)
                reason_stop[row] = True
                done[pos] = True
        return done

    def _outputs(
        self,
        rows: Sequence[Row],
        tokens: torch.Tensor,
        logprobs: torch.Tensor,
        lengths: torch.Tensor,
        reason_stop: torch.Tensor,
        stop_cut: dict[int, int],
    ) -> list[GenerationOutput]:
        tokens_l, lengths_l, stop_l = (
            tokens.cpu().tolist(),
            lengths.cpu().tolist(),
            reason_stop.cpu().tolist(),
        )
        logprobs = logprobs.cpu()
        outs = []
        for i, r in enumerate(rows):
            n = lengths_l[i]
            ids = tokens_l[i][:n]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            if i in stop_cut:
                text = text[: stop_cut[i]]
            outs.append(
                GenerationOutput(
                    prompt_token_ids=list(r.prompt),
                    token_ids=ids,
                    logprobs=logprobs[i, :n].clone(),
                    finish_reason="stop" if stop_l[i] else "length",
                    text=text,
                )
            )
        return outs
