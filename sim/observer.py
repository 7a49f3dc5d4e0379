"""What an engine reports as it runs: the figures of a batch and the observer that hears them.

The server's logs and metrics, and benchmarks, implement `Observer`; the engine knows nothing
of them beyond this protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sim.engine import Engine


@dataclass
class PrefillStats:
    new_seq: int
    new_tokens: int
    cached_tokens: int
    host_loaded_tokens: int
    token_usage: float
    running: int
    queued: int
    pending_tokens: int
    duration: float
    retracted_readmitted: int


@dataclass
class DecodeStats:
    running: int
    used_tokens: int
    token_usage: float
    gen_throughput: float
    queued: int


class Observer(Protocol):
    """What the server (logs, metrics) or a benchmark wants to hear about."""

    def prefill_batch(self, engine: Engine, stats: PrefillStats) -> None: ...
    def decode_log(self, engine: Engine, stats: DecodeStats) -> None: ...
    def retracted(self, engine: Engine, count: int, old_ratio: float, new_ratio: float) -> None: ...


class NullObserver:
    def prefill_batch(self, engine: Engine, stats: PrefillStats) -> None:
        return None

    def decode_log(self, engine: Engine, stats: DecodeStats) -> None:
        return None

    def retracted(self, engine: Engine, count: int, old_ratio: float, new_ratio: float) -> None:
        return None
