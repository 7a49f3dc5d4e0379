"""The GPU memory a server left free under load, measured around a campaign's step.

The GPU memory a server left free under load: the evidence a step past the engine's own
reserve needs besides a kept step.

PyTorch's caching allocator keeps the blocks it has used, so the memory NVML (or DCGM's
`DCGM_FI_DEV_FB_USED`) shows used by a server that has run under load includes its largest
activations so far; what is free then is the room a larger pool can still take. The reading is
taken after a kept trial, from the GPUs of the server as it runs, and the tightest GPU counts.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from playbooks.engines.base import EngineClient, EngineError
from playbooks.sources.gpu import GpuReader, GpuUnavailable

log = logging.getLogger(__name__)

GIB = 1 << 30
# Left free after a step's larger pool: the allocator's fragmentation and the larger decode
# batch the bigger pool admits (its logits: a 160K vocabulary at fp32 is 0.6 MB a request, so a
# hundred more requests take 60 MB). The largest prefill batch, a full chunk, runs within
# minutes of saturating load, so the trial has seen it. SGLang's own reserve is several times
# this; the check lets a step spend only the part of it the server showed it does not use.
ROOM_MARGIN_GIB = 1.0


# Activations stop shrinking with the chunk below this many tokens (SGLang's reserve rule
# counts at least this much: `playbooks/engines/sglang/argument_checks.py::MIN_CHUNK`), so
# nothing is credited below it and no step halves the chunk past it.
MIN_CREDITED_CHUNK = 2048
# A step must give up at least this share of its chunk to measure what a token takes: over a
# few tokens the readings' own noise would be divided by little and credited at scale.
MIN_CHUNK_REDUCTION = 0.25


@dataclass(frozen=True)
class ChunkCredit:
    """What a prefill-chunk token took of the GPUs' memory under load, as this server showed it.

    A kept step that shrank the prefill chunk (SGLang's `chunked_prefill_size`) and grew the
    pool by `added` GiB per GPU, and changed nothing else, left the room `after` where it was
    `before`: the chunk's tokens it gave up had taken `after - before + added` GiB, their
    activations at the largest prefill batch. The GPUs' memory is read, never modelled here, so
    the activations' true peak (which no server reports) is in it. A further, smaller chunk is
    credited as much per token it gives up, down to MIN_CREDITED_CHUNK, and never more in all
    than the step measured.
    """

    key: str  # the engine's chunk argument
    chunk: int  # the chunk the server runs now
    gib_per_token: float
    measured_gib: float = 0.0  # what the kept step's smaller chunk was measured to free

    def freed(self, change: Mapping[str, Any]) -> float:
        """GiB per GPU the change's smaller chunk frees (0 where it keeps the chunk)."""
        new = change.get(self.key)
        if not isinstance(new, int) or isinstance(new, bool) or new >= self.chunk or new <= 0:
            return 0.0
        tokens = self.chunk - max(new, MIN_CREDITED_CHUNK)
        return min(max(0.0, self.gib_per_token * tokens), self.measured_gib)


def chunk_credit(
    key: str, chunks: tuple[int, int], rooms: tuple[float, float], added_gib: float
) -> ChunkCredit | None:
    """The credit a kept step that went from chunk `chunks[0]` to `chunks[1]`, adding
    `added_gib` per GPU to the pool, shows with the room `rooms[0]` before and `rooms[1]` after;
    None where the step did not give up MIN_CHUNK_REDUCTION of the chunk (above
    MIN_CREDITED_CHUNK) or shows no memory freed by it."""
    before, after = chunks
    if after <= 0 or after > before * (1 - MIN_CHUNK_REDUCTION):
        return None
    tokens = before - max(after, MIN_CREDITED_CHUNK)
    freed = rooms[1] - rooms[0] + added_gib
    if tokens <= 0 or freed <= 0:
        return None
    return ChunkCredit(key, after, freed / tokens, freed)


@dataclass(frozen=True)
class GpuRoom:
    """The least free memory over the server's GPUs, after it ran under load."""

    free_gib: float
    source: str  # where it was read, for the operator
    chunk: ChunkCredit | None = None  # what a smaller prefill chunk frees, where measured

    def refusal(self, extra_gib: float, change: Mapping[str, Any] | None = None) -> str | None:
        """Why a change taking `extra_gib` more per GPU does not fit (None: it does); a smaller
        chunk in `change` gives back what the measured credit says it frees."""
        freed = self.chunk.freed(change) if self.chunk is not None and change else 0.0
        left = self.free_gib + freed - extra_gib
        if left >= ROOM_MARGIN_GIB:
            return None
        credit = (
            f" and {freed:.1f} GiB its smaller prefill chunk frees (measured on the last kept step)"
            if freed
            else ""
        )
        return (
            f"it takes {extra_gib:.1f} GiB more per GPU, and the GPUs had {self.free_gib:.1f} GiB "
            f"free under load after the kept step ({self.source}){credit}: {left:.1f} GiB would "
            f"be left, less than the {ROOM_MARGIN_GIB:g} GiB margin"
        )


@dataclass(frozen=True)
class RoomBefore:
    """What a step's room after it is measured against: the GPUs' free memory before it (read
    when the step was proposed or started, the server as it ran then), the chunk the server ran
    (`Engine.chunk_of`), the GPU memory per GPU the step adds to the pool (the rules'
    `static_gpu_gib`) and the step's change."""

    free_gib: float
    chunk: Any
    adds_gib: float | None
    change: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "free_gib": round(self.free_gib, 3),
            "chunk": self.chunk,
            "adds_gib": self.adds_gib,
            "change": dict(self.change),
        }

    @classmethod
    def from_json(cls, data: Any) -> RoomBefore | None:
        """Read back from a proposal's snapshot; None where it holds none (or not this shape)."""
        if not isinstance(data, Mapping) or not isinstance(data.get("free_gib"), (int, float)):
            return None
        adds = data.get("adds_gib")
        change = data.get("change")
        return cls(
            float(data["free_gib"]),
            data.get("chunk"),
            float(adds) if isinstance(adds, (int, float)) else None,
            dict(change) if isinstance(change, Mapping) else {},
        )

    def changed_only_chunk_and_fraction(self, key: str) -> bool:
        """The step set the chunk and otherwise at most a memory fraction (a value in (0, 1)):
        then the room it left measures the chunk, not other memory it moved."""
        if key not in self.change:
            return False
        others = [v for k, v in self.change.items() if k != key]
        return all(isinstance(v, float) and 0 < v < 1 for v in others)


def credited(
    after: GpuRoom | None, before: RoomBefore | None, chunk_now: Any, key: str | None
) -> GpuRoom | None:
    """The room read after a kept step, with what its smaller chunk showed a chunk token takes
    (`chunk_credit`) where the room before it was read too and the step changed only the
    chunk and the memory fraction."""
    if after is None or before is None or key is None:
        return after
    if not before.changed_only_chunk_and_fraction(key):
        return after
    chunks = (before.chunk, chunk_now)
    if not all(isinstance(c, int) and not isinstance(c, bool) for c in chunks):
        return after
    rooms = (before.free_gib, after.free_gib)
    credit = chunk_credit(key, (int(chunks[0]), int(chunks[1])), rooms, before.adds_gib or 0.0)
    return after if credit is None else replace(after, chunk=credit)


def read_before(
    reader: GpuReader | None,
    source: str,
    client: EngineClient,
    adds_gib: float | None,
    change: Mapping[str, Any],
) -> RoomBefore | None:
    """The room and the chunk now, before a step making `change`, which adds `adds_gib` (None:
    the GPUs cannot be read)."""
    room = room_of(reader, source)
    if room is None:
        return None
    return RoomBefore(room.free_gib, _chunk(client), adds_gib, dict(change))


def read_after(
    reader: GpuReader | None, source: str, client: EngineClient, before: RoomBefore | None
) -> GpuRoom | None:
    """The room after a kept step, credited with what its smaller chunk freed (`credited`)."""
    return credited(room_of(reader, source), before, _chunk(client), client.engine.chunk_arg)


def _chunk(client: EngineClient) -> int | None:
    try:
        return client.engine.chunk_of(client.settings())
    except EngineError:
        return None


def room_of(reader: GpuReader | None, source: str) -> GpuRoom | None:
    """The room the reader shows now (None: no reader, or the GPUs could not be read). The room
    is evidence a step may go without, so no failure to read it stops one: NVML can fail on any
    call, a DCGM query on its Prometheus."""
    if reader is None:
        return None
    try:
        states = reader.snapshot()
    except GpuUnavailable:
        return None
    except Exception as exc:  # an NVMLError mid-read, a Prometheus error: no reading
        log.warning("the GPUs' free memory could not be read (%s): %s", source, exc)
        return None
    if not states:
        return None
    return GpuRoom(min(g.memory_free_bytes for g in states) / GIB, source)
