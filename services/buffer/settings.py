"""`BufferSettings`: what the buffer core needs from the run config, read once in the service entry.

`services.buffer.service.build_core` builds it from `services.buffer` (the endpoint section: full-buffer
policy, lease length, batch limits, declared consumer groups) and
`buffer.trainer_input.experience_buffer.max_read_timeout`; the core sees this record only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.buffer.store import DEFAULT_CONSUMER_GROUP
from services.buffer.validation import Limits
from services.common.config import RFTConfig

__all__ = ["BufferSettings"]


@dataclass(frozen=True)
class BufferSettings:
    on_full: str = "reject"  # reject | wait
    lease_ms: int = 600_000
    max_read_timeout_s: float = 1800.0
    poll_interval_s: float = 0.05
    limits: Limits = field(default_factory=Limits)
    consumer_groups: tuple[str, ...] = (DEFAULT_CONSUMER_GROUP,)

    @classmethod
    def from_config(cls, config: RFTConfig, vocab_size: int = 0) -> BufferSettings:
        """`vocab_size`: the model's vocabulary size (0: unknown, each batch's own is checked)."""
        endpoint = config.services.buffer
        return cls(
            on_full=endpoint.on_full,
            lease_ms=endpoint.lease_ms,
            max_read_timeout_s=config.buffer.trainer_input.experience_buffer.max_read_timeout,
            limits=Limits(
                max_batch_experiences=endpoint.max_batch_experiences,
                max_batch_bytes=endpoint.max_batch_bytes,
                vocab_size=vocab_size,
            ),
            consumer_groups=tuple(endpoint.consumer_groups),
        )
