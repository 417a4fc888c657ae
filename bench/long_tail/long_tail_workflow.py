"""A plug-in workflow for bench/async_pipeline.py: the quickstart's `arithmetic` workflow with a long tail
of response lengths, as in math RL where a few answers run far longer than the rest.

One task in `long_every` (chosen by a hash of its id, so the same tasks every run) samples exactly
`long_tokens` tokens (min_tokens = max_tokens); the others sample as usual (up to the run's limit,
ending at EOS). Its reward is the arithmetic reward of the response's leading number.
"""

from __future__ import annotations

import dataclasses
import zlib

from services.explorer.workflows.arithmetic import ArithmeticWorkflow


class LongTailArithmetic(ArithmeticWorkflow):
    async def run_async(self):
        every = int(self.args.get("long_every", 8))
        long_tokens = int(self.args.get("long_tokens", 256))
        if zlib.crc32(str(self.task.task_id).encode()) % every == 0:
            sampling = self.task.sampling.replace(min_tokens=long_tokens, max_tokens=long_tokens)
            self.task = dataclasses.replace(self.task, sampling=sampling)
        return await super().run_async()
