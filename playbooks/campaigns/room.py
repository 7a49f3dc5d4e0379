"""The GPU memory a server left free under load: the evidence a step past the engine's own
reserve needs besides a kept step.

PyTorch's caching allocator keeps the blocks it has used, so the memory NVML (or DCGM's
`DCGM_FI_DEV_FB_USED`) shows used by a server that has run under load includes its largest
activations so far; what is free then is the room a larger pool can still take. The reading is
taken after a kept trial, from the GPUs of the server as it runs, and the tightest GPU counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from playbooks.sources.gpu import GpuReader, GpuUnavailable

GIB = 1 << 30
# Left free after a step's larger pool: the allocator's fragmentation and the larger decode
# batch the bigger pool admits (its logits: a 160K vocabulary at fp32 is 0.6 MB a request, so a
# hundred more requests take 60 MB). The largest prefill batch, a full chunk, runs within
# minutes of saturating load, so the trial has seen it. SGLang's own reserve is several times
# this; the check lets a step spend only the part of it the server showed it does not use.
ROOM_MARGIN_GIB = 1.0


@dataclass(frozen=True)
class GpuRoom:
    """The least free memory over the server's GPUs, after it ran under load."""

    free_gib: float
    source: str  # where it was read, for the operator

    def refusal(self, extra_gib: float) -> str | None:
        """Why a change taking `extra_gib` more per GPU does not fit (None: it does)."""
        left = self.free_gib - extra_gib
        if left >= ROOM_MARGIN_GIB:
            return None
        return (
            f"it takes {extra_gib:.1f} GiB more per GPU, and the GPUs had {self.free_gib:.1f} GiB "
            f"free under load after the kept step ({self.source}): {left:.1f} GiB would be "
            f"left, less than the {ROOM_MARGIN_GIB:g} GiB margin"
        )


def room_of(reader: GpuReader | None, source: str) -> GpuRoom | None:
    """The room the reader shows now (None: no reader, or the GPUs could not be read)."""
    if reader is None:
        return None
    try:
        states = reader.snapshot()
    except GpuUnavailable:
        return None
    if not states:
        return None
    return GpuRoom(min(g.memory_free_bytes for g in states) / GIB, source)
