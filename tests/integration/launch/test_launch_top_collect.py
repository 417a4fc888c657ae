"""`rft top`'s collector against a live buffer (the memory store, in this process): its `Stats` and
`Progress` land in the snapshot, and a trainer with no port yet is recorded as not answering."""

from __future__ import annotations

import json

from launcher.top.collect import Collector
from launcher.top.targets import Target, Targets
from services.buffer.service import build_core
from services.buffer.servicer import registration
from services.common import liveness
from services.common.config import load_config
from services.common.rpc import start_server


async def test_snapshot_of_a_live_buffer_and_a_trainer_without_a_port():
    config = {
        "services": {"buffer": {"store": "memory"}},
        "buffer": {"trainer_input": {"experience_buffer": {"capacity": 64}}},
    }
    core = build_core(load_config(text=json.dumps(config)))
    await core.start()
    handle = await start_server([registration(core), liveness.registration()])
    collector = Collector(Targets([Target("buffer", handle.address), Target("trainer", "")]), timeout_s=10)
    try:
        snap = await collector.snapshot()
    finally:
        await collector.close()
        await handle.stop(0)
        await core.close()
    buffer, trainer = snap.services
    assert buffer.answered and buffer.pid > 0 and not trainer.answered and trainer.error == "no port yet"
    assert snap.buffer is not None and snap.buffer.answered
    stats = snap.buffer.stats
    assert (stats.store, stats.capacity, stats.size) == ("memory", 64, 0)
    assert snap.buffer.oldest_version is None  # nothing stored
    assert snap.trainer is not None and not snap.trainer.answered
