"""The typed facts vLLM's rules decide over, and the small arithmetic they share.

`Server` holds what is known before any measurement (settings, capacity model, host memory), so
the safety half of a check cannot read a measurement by mistake; `Context` adds one measurement
for the bottleneck analysis and the proposals; `Observed` (`playbooks.engines.kit.checks`) is
what the usefulness half reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from playbooks.engines.types import Measurement
from playbooks.engines.vllm.capacity import CapacityModel
from playbooks.engines.vllm.client import VLLMSettings
from playbooks.sources.host import HostMemory

# KV usage at or above this with a queue: the block pool is the limit. vLLM counts cached
# blocks nobody references as free (v1/core/block_pool.py: they are evicted on demand), so a
# usage near 1 is held by requests, not by the prefix cache.
SATURATED_USAGE = 0.9
PREEMPTING_USAGE = 0.7  # with preemptions, a pool this full already limits admission
# vLLM's guide (docs/configuration/optimization.md, "Preemption"): frequent preemptions cost
# recomputation; kvpilot calls more than one a minute frequent.
PREEMPTIONS_PER_MIN_HIGH = 1.0
PROMPT_HEAVY = 4.0  # prompt tokens per output token beyond which prefill dominates
PREFIX_SHARE = 0.2  # prompt tokens served from the cache beyond which prefixes are shared
# The release whose scheduler kvpilot read admitting a prompt only when all of it fits.
FULL_PROMPT_ADMISSION = (0, 32, 0)


def parse_version(text: str) -> tuple[int, int, int]:
    """`0.32.0`, `0.11.1rc2`, `0.10.0+cpu` -> (0, 32, 0) ...; (0, 0, 0) when unreadable."""
    parts = [int(p) for p in re.findall(r"\d+", text.split("+", maxsplit=1)[0])[:3]]
    parts += [0] * (3 - len(parts))
    return (parts[0], parts[1], parts[2])


@dataclass(frozen=True)
class Server:
    """One server's facts before any measurement: what a safety check may read."""

    info: VLLMSettings
    cap: CapacityModel
    host: HostMemory | None


@dataclass(frozen=True)
class Context:
    """Everything the bottleneck analysis and the proposals need: the server and a measurement."""

    info: VLLMSettings
    m: Measurement
    cap: CapacityModel
    host: HostMemory | None

    @property
    def server(self) -> Server:
        return Server(self.info, self.cap, self.host)


def preempts_often(m: Measurement) -> bool:
    """More preemptions a minute than vLLM's guide treats as a problem."""
    rate = preemption_rate(m)
    return rate is not None and rate > PREEMPTIONS_PER_MIN_HIGH


def seq_cap_total(info: VLLMSettings) -> int | None:
    """Requests that may run at once over the server: each engine scheduler's own
    `max_num_running_reqs` (v1/core/sched/scheduler.py), one per DP engine: `--max-num-seqs`,
    or `--max-num-active-seqs` where set (config/scheduler.py: at most max_num_seqs)."""
    value = info.arg("max_num_seqs")
    if not isinstance(value, int):
        return None
    active = active_seq_cap(info)
    return min(value, active if active is not None else value) * info.engines


def active_seq_cap(info: VLLMSettings) -> int | None:
    """`--max-num-active-seqs` where it is set below `--max-num-seqs`: the admission cap."""
    active, seqs = info.arg("max_num_active_seqs"), info.arg("max_num_seqs")
    if not isinstance(active, int) or (isinstance(seqs, int) and active >= seqs):
        return None
    return active


def seq_cap_name(info: VLLMSettings) -> str:
    """The flag that caps the running batch."""
    return "max_num_active_seqs" if active_seq_cap(info) is not None else "max_num_seqs"


def pool_tokens(info: VLLMSettings) -> int:
    return info.capacity_tokens


def resident_tokens(info: VLLMSettings, m: Measurement) -> float | None:
    """KV a running request holds on average: its prompt plus half its answer so far."""
    if m.avg_prompt_tokens is not None and m.avg_output_tokens is not None:
        return m.avg_prompt_tokens + m.avg_output_tokens / 2
    if m.token_usage and m.running and info.capacity_tokens:
        return m.token_usage * info.capacity_tokens / m.running
    return None


def requests_fitting(info: VLLMSettings, m: Measurement, tokens: int | None = None) -> float | None:
    """Requests of the observed size that fit in `tokens` (the pool now by default), 10% spare."""
    per = resident_tokens(info, m)
    pool = tokens or info.capacity_tokens
    if not per or not pool:
        return None
    return pool * 0.9 / per


def preemption_rate(m: Measurement) -> float | None:
    """Preemptions a minute over the window, None where the counter is not exported."""
    if m.retractions is None or m.window_s <= 0:
        return None
    return m.retractions / (m.window_s / 60)


def is_preempting(m: Measurement) -> bool:
    return (preemption_rate(m) or 0.0) > 0


def free_tokens_per_engine(info: VLLMSettings, m: Measurement) -> float | None:
    """Free KV tokens in one engine's pool, on average over the window."""
    if m.token_usage is None or not info.capacity_tokens:
        return None
    return (1 - m.token_usage) * info.capacity_tokens / info.engines


def prompt_waits_for_blocks(info: VLLMSettings, m: Measurement) -> bool:
    """Whether a waiting prompt is larger than the free blocks: since 0.32 vLLM admits a new
    request only if its whole uncached prompt fits (`--scheduler-reserve-full-isl`, on by
    default, config/scheduler.py:190), and admission stops at the first that does not (FCFS,
    v1/core/sched/scheduler.py), so a queue can stand while usage is below the top."""
    free = free_tokens_per_engine(info, m)
    prompt = m.avg_prompt_tokens
    if free is None or prompt is None or m.queued < 1:
        return False
    if parse_version(info.version) < FULL_PROMPT_ADMISSION:
        return False
    uncached = prompt * (1 - (m.cached_fraction or 0.0))
    return uncached > free


def prefix_heavy(m: Measurement) -> bool:
    """Prompts that dominate the work and share prefixes: what a prefix tier helps."""
    prompt, output = m.avg_prompt_tokens, m.avg_output_tokens
    heavy = prompt is not None and output is not None and prompt >= PROMPT_HEAVY * output
    return heavy and (m.cached_fraction or 0.0) >= PREFIX_SHARE
