"""The changes kvpilot proposes for a vLLM bottleneck: an ordered table of proposal rules.

The table follows vLLM's own tuning advice (docs/configuration/optimization.md, and the order of
its tuner, benchmarks/auto_tune/auto_tune.sh: the highest utilization that starts, then the
sequence cap and token budget), from the least risky change to the most: more of the GPU for
the KV cache; an 8-bit KV cache (accuracy, so only with an opt-in); against frequent preemption
fewer sequences; a smaller step budget or no CUDA graphs for a little more KV; host-RAM
offloading only where prefixes are reused. Each rule proposes at most one change, judged by
`evaluate` like any change an operator asks about.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from playbooks.engines.kit import proposals as kit
from playbooks.engines.types import Bottleneck, Option
from playbooks.engines.vllm.allow_list import FP8_DTYPES
from playbooks.engines.vllm.argument_checks import server_start_limit
from playbooks.engines.vllm.capacity import HIGHEST_UTILIZATION, RECOMMENDED_UTILIZATION
from playbooks.engines.vllm.facts import (
    PREEMPTIONS_PER_MIN_HIGH,
    Context,
    active_seq_cap,
    preemption_rate,
    preempts_often,
    prefix_heavy,
    requests_fitting,
    seq_cap_total,
)
from playbooks.engines.vllm.proposed_change import HOST_SHARE
from playbooks.engines.vllm.shared_gpu import highest_that_starts
from playbooks.engines.vllm.verdicts import evaluate

UTILIZATION_STEP = 0.005  # a value closer than this to today's is not worth a restart
FEWER_SEQS = 0.75  # max_num_seqs against preemption: this share of what ran
SMALLEST_BUDGET = 2048  # vLLM's own default budget on smaller GPUs (arg_utils.py)
THROUGHPUT_BUDGET = 16384  # vLLM's guide: above 8192 for throughput; its default on large GPUs
OFFLOAD_KV_MULTIPLE = 2  # a host tier twice the GPU pool holds the reused prefixes it evicts

Proposal = Callable[[Context, Bottleneck], Option | None]


more_clients = kit.client_bound(requests_fitting)


def _utilization(ctx: Context, bottleneck: Bottleneck, target: float) -> Option | None:
    if ctx.cap.sized_by_bytes or target <= ctx.cap.utilization + UTILIZATION_STEP:
        return None
    return evaluate({"gpu_memory_utilization": target}, ctx, bottleneck)


def recommended_utilization(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    """Up to the share that keeps 5% of the GPU outside vLLM's budget, or, on a GPU another
    process shares, the highest share that still starts there (`shared_gpu.py`)."""
    limit = server_start_limit(ctx.server)
    target = RECOMMENDED_UTILIZATION
    if limit is not None:
        target = min(target, highest_that_starts(limit))
    return _utilization(ctx, bottleneck, target)


def highest_utilization(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    """The highest share vLLM's own tuner tries: possible, with the headroom named."""
    return _utilization(ctx, bottleneck, HIGHEST_UTILIZATION)


def past_utilization(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    """One step past the highest, so the operator sees where the limit is and why."""
    if ctx.cap.sized_by_bytes:
        return None
    return evaluate(
        {"gpu_memory_utilization": round(max(HIGHEST_UTILIZATION, ctx.cap.utilization) + 0.01, 2)},
        ctx,
        bottleneck,
    )


def more_kv_bytes(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    """Where the KV bytes flag sizes the cache, a quarter more of it (utilization is ignored)."""
    flag = ctx.cap.kv_bytes_flag
    if flag is None or bottleneck != "kv_cache":
        return None
    mib = 1 << 20
    return evaluate({"kv_cache_memory_bytes": math.floor(flag * 1.25 / mib) * mib}, ctx, bottleneck)


def fp8_kv(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    if ctx.cap.kv_dtype in FP8_DTYPES:
        return None
    return evaluate({"kv_cache_dtype": "fp8"}, ctx, bottleneck)


def fewer_seqs(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    """Against frequent preemption, vLLM's guide lowers max_num_seqs."""
    now = ctx.info.arg("max_num_seqs")
    rpm = preemption_rate(ctx.m)
    if bottleneck != "kv_cache" or not isinstance(now, int) or rpm is None:
        return None
    if rpm <= PREEMPTIONS_PER_MIN_HIGH:
        return None
    per_engine = ctx.m.running / ctx.info.engines
    wanted = max(1, math.floor(min(per_engine, now) * FEWER_SEQS))
    if wanted >= now:
        return None
    return evaluate({"max_num_seqs": wanted}, ctx, bottleneck)


def more_seqs(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    """Twice the sequence cap, unless `--max-num-active-seqs` is the cap (more max_num_seqs
    would not lift it, and kvpilot does not edit that flag)."""
    now = ctx.info.arg("max_num_seqs")
    if bottleneck != "compute" or seq_cap_total(ctx.info) is None or not isinstance(now, int):
        return None
    if active_seq_cap(ctx.info) is not None:
        return None
    change: dict[str, int] = {"max_num_seqs": now * 2}
    budget = ctx.info.arg("max_num_batched_tokens")
    if isinstance(budget, int) and budget < now * 2:
        change["max_num_batched_tokens"] = now * 2  # vLLM needs the budget to cover the cap
    return evaluate(dict(change), ctx, bottleneck)


def smaller_budget(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    """A smaller step budget frees activation memory for KV (vLLM profiles a step of it)."""
    now = ctx.info.arg("max_num_batched_tokens")
    seqs = ctx.info.arg("max_num_seqs")
    if bottleneck != "kv_cache" or not isinstance(now, int) or now <= SMALLEST_BUDGET:
        return None
    wanted = max(SMALLEST_BUDGET, now // 2, seqs if isinstance(seqs, int) else 0)
    if wanted >= now:
        return None
    return evaluate({"max_num_batched_tokens": wanted}, ctx, bottleneck)


def larger_budget(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    now = ctx.info.arg("max_num_batched_tokens")
    if bottleneck != "prefill" or not isinstance(now, int) or now >= THROUGHPUT_BUDGET:
        return None
    return evaluate({"max_num_batched_tokens": min(THROUGHPUT_BUDGET, now * 2)}, ctx, bottleneck)


def eager(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    if bottleneck != "kv_cache" or ctx.info.arg("enforce_eager"):
        return None
    return evaluate({"enforce_eager": True}, ctx, bottleneck)


def offloading(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    """A host tier for evicted prefixes, sized to the host, where prefixes are reused or
    requests are preempted often (their blocks come back from it: `OffloadCheck`)."""
    if ctx.info.arg("kv_offloading_size") is not None or bottleneck != "kv_cache":
        return None
    if not (prefix_heavy(ctx.m) or preempts_often(ctx.m)):
        return None
    engines = max(1, ctx.info.engines)  # each data-parallel engine pins the whole size
    budget = ctx.host.available_gib * HOST_SHARE / engines if ctx.host is not None else None
    kv = ctx.cap.kv_gib
    wanted = kv * ctx.info.tp_size * OFFLOAD_KV_MULTIPLE if kv is not None else None
    sizes = [x for x in (wanted, budget) if x is not None]
    size = math.floor(min(sizes)) if sizes else 0
    if size <= 0:
        return None
    return evaluate({"kv_offloading_size": float(size)}, ctx, bottleneck)


# In the order the options are listed before sorting by verdict.
PROPOSALS: tuple[Proposal, ...] = (
    more_clients,
    recommended_utilization,
    highest_utilization,
    past_utilization,
    more_kv_bytes,
    fp8_kv,
    fewer_seqs,
    more_seqs,
    smaller_budget,
    larger_budget,
    eager,
    offloading,
)


def propose(ctx: Context, bottleneck: Bottleneck) -> list[Option]:
    """Every change a rule proposes for this server and bottleneck, each with its verdict."""
    return kit.propose(PROPOSALS, ctx, bottleneck)
