"""vLLM on a GPU it shares with other processes: the utilization it can still start with.

vLLM asks for `ceil(total * gpu_memory_utilization)` of *free* memory when it starts, and stops
with "Free memory on device ... on startup is less than desired GPU memory utilization"
otherwise (v1/worker/utils.py `request_memory`). A restart frees the server's own budget first,
so on each GPU it runs on it can ask for today's utilization plus what NVML sees free now: a
change past that restarts the server into a refusal, and then the revert.

NVML shows every GPU of the host, not which ones the server runs on. A GPU whose use is below
the server's own budget cannot be one of them; among the others, the server runs on `ranks` of
them (TP x PP x DP engines). The change surely fails where even the `ranks` GPUs with the most
free memory cannot give it (the most favourable placement), and may fail where the fullest
candidate cannot.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from playbooks.sources.gpu import GpuState

GIB = 1 << 30
# A GPU holding the server holds at least this share of its budget (the budget is what vLLM
# allocates; the share leaves room for NVML's rounding and a budget not yet filled).
HOLDS_BUDGET = 0.9


@dataclass(frozen=True)
class StartLimit:
    """The highest utilization vLLM can start with, surely (`highest`) and on the fullest GPU
    that may be the server's (`worst`), with what that GPU holds beside the server's budget."""

    highest: float
    worst: float
    total_gib: float
    free_gib: float  # on the GPU that binds `highest`
    others_gib: float  # held there beside the server's budget (other processes, contexts)
    worst_others_gib: float


def start_limit(utilization: float, gpus: Sequence[GpuState], ranks: int) -> StartLimit | None:
    """None where no GPU could be the server's (or none is known)."""
    candidates = [
        g for g in gpus if g.memory_used_bytes >= HOLDS_BUDGET * utilization * g.memory_total_bytes
    ]
    if not candidates:
        return None
    by_free = sorted(candidates, key=lambda g: g.memory_free_bytes, reverse=True)
    binding = by_free[min(max(ranks, 1), len(by_free)) - 1]
    fullest = by_free[-1]

    def limit(g: GpuState) -> float:
        return utilization + g.memory_free_bytes / g.memory_total_bytes

    def others(g: GpuState) -> float:
        return max(0.0, (g.memory_used_bytes - utilization * g.memory_total_bytes) / GIB)

    return StartLimit(
        highest=limit(binding),
        worst=limit(fullest),
        total_gib=binding.memory_total_bytes / GIB,
        free_gib=binding.memory_free_bytes / GIB,
        others_gib=others(binding),
        worst_others_gib=others(fullest),
    )


def ranks_of(tp: int, pp: int, engines: int) -> int:
    """The GPUs a server takes on its host: every engine's TP x PP ranks."""
    return max(1, tp) * max(1, pp) * max(1, engines)


def two_decimals_down(utilization: float) -> float:
    """A limit in the two decimals a proposal uses, never rounded up past it."""
    return math.floor(utilization * 100 + 1e-9) / 100


def highest_that_starts(limit: StartLimit) -> float:
    return two_decimals_down(limit.highest)
