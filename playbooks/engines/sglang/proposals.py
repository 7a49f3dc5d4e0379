"""The changes kvpilot proposes for a bottleneck: an ordered table of proposal rules.

Each rule looks at the measured server and its bottleneck and proposes at most one change, judged
by `evaluate` like any change an operator asks about; the table's order is the order of the list
before it is sorted by verdict.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from playbooks.engines.sglang.capacity import GIB, HostBudget
from playbooks.engines.sglang.checks import dtype_bytes
from playbooks.engines.sglang.facts import (
    RETRACTIONS_PER_MIN_HIGH,
    Context,
    requests_fitting,
    retraction_rate,
)
from playbooks.engines.sglang.verdicts import evaluate
from playbooks.types import Bottleneck, Option

FRACTION_STEP = 0.004  # a safe fraction closer than this to the current one is not worth a restart
MORE_CAUTIOUS = 1.3  # schedule_conservativeness factor against frequent retractions
MORE_EAGER = 0.5  # and against a queue beside an under-used pool

Proposal = Callable[[Context, Bottleneck], Option | None]


def more_clients(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    if bottleneck != "client":
        return None
    return Option(
        title="raise client concurrency",
        change={},
        verdict="recommended",
        predicted_max_total_num_tokens=None,
        predicted_gain=None,
        risk="none on the server",
        reasons=[
            f"only {ctx.m.running:.1f} requests ran and none waited: send more at once "
            f"(the server has room for ~{requests_fitting(ctx.info, ctx.m) or 0:.0f})"
        ],
    )


def safe_fraction(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    """The largest fraction that keeps the activation floor, where it is above today's."""
    safe = ctx.cap.safe_max_fraction(ctx.hicache_on)
    if safe <= ctx.cap.mem_fraction_static + FRACTION_STEP:
        return None
    return evaluate({"mem_fraction_static": safe}, ctx, bottleneck)


def next_fraction(ctx: Context, bottleneck: Bottleneck) -> Option:
    """One step past the safe fraction, so the operator sees where the limit is and why."""
    safe = ctx.cap.safe_max_fraction(ctx.hicache_on)
    unsafe_next = round(max(safe, ctx.cap.mem_fraction_static) + 0.01, 2)
    return evaluate({"mem_fraction_static": unsafe_next}, ctx, bottleneck)


def fp8_kv(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    if dtype_bytes(ctx.cap.kv_dtype) < 2.0:
        return None
    return evaluate({"kv_cache_dtype": "fp8_e4m3"}, ctx, bottleneck)


def _hicache_refused(ctx: Context, risk: str, reason: str) -> Option:
    return Option(
        title="hierarchical cache (host RAM)",
        change={"enable_hierarchical_cache": True},
        verdict="unsafe",
        predicted_max_total_num_tokens=ctx.info.max_total_num_tokens,
        predicted_gain=None,
        risk=risk,
        reasons=[reason],
    )


def hicache_proposal(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    """Size a host pool that all ranks together fit in host RAM; judge whether it helps."""
    if ctx.hicache_on:
        return None
    if ctx.host is None:
        return _hicache_refused(
            ctx,
            "host OOM if the per-rank pools overcommit RAM",
            "host RAM is unknown (configure host_ram_gib or run on the GPU host), so a host "
            "pool cannot be checked against it",
        )
    budget = HostBudget.of(ctx.host.total_gib, ctx.host.available_gib, ctx.ranks_on_host)
    device_gb = ctx.info.max_total_num_tokens * ctx.cap.bytes_per_token / 1e9
    per_rank_gb = min(budget.per_rank_budget_gib * GIB / 1e9, 2 * device_gb)
    size_gb = math.floor(per_rank_gb)
    if size_gb <= 0 or (not ctx.host_pool_may_be_smaller and size_gb <= device_gb):
        return _hicache_refused(
            ctx,
            "host OOM",
            f"the host cannot hold a pool larger than the GPU pool ({device_gb:.1f} GB) on each "
            f"of {ctx.ranks_on_host} ranks: {budget.per_rank_budget_gib:.1f} GiB per rank is "
            "available after SGLang's 10 GiB reserve and a 10% margin",
        )
    return evaluate({"enable_hierarchical_cache": True, "hicache_size": size_gb}, ctx, bottleneck)


def _conservativeness(ctx: Context, factor: float, bottleneck: Bottleneck) -> Option:
    current = float(ctx.info.arg("schedule_conservativeness") or 1.0)
    return evaluate({"schedule_conservativeness": round(current * factor, 2)}, ctx, bottleneck)


def fewer_retractions(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    rpm = retraction_rate(ctx.m)
    if bottleneck != "kv_cache" or rpm is None or rpm <= RETRACTIONS_PER_MIN_HIGH:
        return None
    return _conservativeness(ctx, MORE_CAUTIOUS, bottleneck)


def eager_admission(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    if bottleneck != "unknown":
        return None
    return _conservativeness(ctx, MORE_EAGER, bottleneck)


def larger_batch(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    limit = ctx.info.effective_max_running_requests
    if bottleneck != "compute" or not limit:
        return None
    return evaluate({"max_running_requests": limit * 2}, ctx, bottleneck)


# In the order the options are listed before sorting by verdict.
PROPOSALS: tuple[Proposal, ...] = (
    more_clients,
    safe_fraction,
    next_fraction,
    fp8_kv,
    hicache_proposal,
    fewer_retractions,
    eager_admission,
    larger_batch,
)


def propose(ctx: Context, bottleneck: Bottleneck) -> list[Option]:
    """Every change a rule proposes for this server and bottleneck, each with its verdict."""
    return [o for rule in PROPOSALS if (o := rule(ctx, bottleneck)) is not None]
