"""The changes kvpilot proposes for a bottleneck: an ordered table of proposal rules.

Each rule looks at the measured server and its bottleneck and proposes at most one change, judged
by `evaluate` like any change an operator asks about; the table's order is the order of the list
before it is sorted by verdict.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from playbooks.engines.kit import proposals as kit
from playbooks.engines.sglang.argument_checks import LPM_QUEUE_LIMIT, MIN_CHUNK, prefix_heavy
from playbooks.engines.sglang.bottleneck import kv_bound, signals
from playbooks.engines.sglang.capacity import GIB, HOST_MARGIN, HostBudget
from playbooks.engines.sglang.deployment import attn_dp_size, decode_max_bs, dp_replicas
from playbooks.engines.sglang.facts import (
    RETRACTIONS_PER_MIN_HIGH,
    Context,
    conservativeness,
    conservativeness_scale,
    grammar_waiting,
    requests_fitting,
    retraction_rate,
    running_cap_total,
)
from playbooks.engines.sglang.hicache import race_limit_gb
from playbooks.engines.sglang.proposed_change import dtype_bytes
from playbooks.engines.sglang.reservation import CONSERVATIVENESS_SATURATION
from playbooks.engines.sglang.verdicts import evaluate
from playbooks.engines.types import Bottleneck, Option

FRACTION_STEP = 0.004  # a safe fraction closer than this to the current one is not worth a restart
MORE_CAUTIOUS = 1.3  # schedule_conservativeness factor against frequent retractions
MORE_EAGER = 0.5  # and against a queue beside an under-used pool
# Arguments SGLang derives the default fraction from (memory_hook.py).
COUPLED = frozenset(
    {"chunked_prefill_size", "max_running_requests", "attn_dp_size", "cuda_graph_max_bs_decode"}
)
# The saturation rounded down to what a proposal spells: 1.42 x 0.7 = 0.994, still below 1.0.
SATURATED_CONSERVATIVENESS = math.floor(CONSERVATIVENESS_SATURATION * 100) / 100

Proposal = Callable[[Context, Bottleneck], Option | None]


more_clients = kit.client_bound(requests_fitting)


def safe_fraction(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    """The largest fraction that keeps SGLang's reserve floor and the activation floor."""
    best = ctx.cap.recommended_max_fraction(ctx.hicache_on)
    if best <= ctx.cap.mem_fraction_static + FRACTION_STEP:
        return None
    return evaluate({"mem_fraction_static": best}, ctx, bottleneck)


def smaller_chunk_fraction(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    """A smaller prefill chunk with the larger fraction SGLang's own rule then allows.

    SGLang reserves 1.5 MB per prefill-chunk token for activations (`reserve.py`); where that
    term, not the reserve's floor, holds the pool back, halving the chunk frees reserve for the
    KV pool at SGLang's own margin. The largest chunk that reaches the best such fraction is
    proposed: a smaller one would cost prefill throughput for no more room.
    """
    cap = ctx.cap
    if cap.deployment is None or bottleneck != "kv_cache":
        return None
    now = cap.deployment.chunked_prefill_size
    if now <= MIN_CHUNK:
        return None
    floor = max(cap.recommended_max_fraction(ctx.hicache_on), cap.mem_fraction_static)
    page = max(1, cap.page_size)
    best: tuple[float, int] | None = None
    chunk = now // 2
    while chunk >= MIN_CHUNK and chunk % page == 0:
        fraction = cap.recommended_max_fraction(ctx.hicache_on, chunk)
        if fraction > floor + FRACTION_STEP and (best is None or fraction > best[0]):
            best = (fraction, chunk)
        chunk //= 2
    if best is None:
        return None
    fraction, chunk = best
    return evaluate(
        {"chunked_prefill_size": chunk, "mem_fraction_static": fraction}, ctx, bottleneck
    )


def closest_fraction(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    """The largest fraction that still keeps the activation floor, where it is above the
    recommended one: possible, with the headroom it gives up named in numbers."""
    safe = ctx.cap.safe_max_fraction(ctx.hicache_on)
    best = max(ctx.cap.recommended_max_fraction(ctx.hicache_on), ctx.cap.mem_fraction_static)
    if safe <= best + FRACTION_STEP:
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
    geometry = ctx.cap.geometry
    indexer = geometry.indexer_bytes if geometry is not None else 0
    kv_bytes = ctx.cap.bytes_per_token - indexer
    device_gb = ctx.info.max_total_num_tokens * kv_bytes / 1e9
    # a DSA model pins its indexer keys beside the KV host pool, as many tokens again
    per_rank_gb = min(
        budget.per_rank_budget_gib * GIB / 1e9 * kv_bytes / ctx.cap.bytes_per_token,
        2 * device_gb,
    )
    raced = race_limit_gb(ctx.server)
    if raced is not None:  # a size the last rank to start still accepts, with the margin
        per_rank_gb = min(per_rank_gb, raced * (1 - HOST_MARGIN))
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
    # Never past the saturation: the initial ratio is min(0.7 x value, 1.0), so more changes
    # nothing (new_token_ratio_tracker.py `NewTokenRatioTracker.from_config`).
    # The flag is what is spelt: under attention DP SGLang uses 0.3 x the flag.
    scale = conservativeness_scale(ctx.info)
    value = min(conservativeness(ctx.info) * factor, SATURATED_CONSERVATIVENESS)
    return evaluate({"schedule_conservativeness": round(value / scale, 2)}, ctx, bottleneck)


def fewer_retractions(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    rpm = retraction_rate(ctx.m)
    if bottleneck != "kv_cache" or rpm is None or rpm <= RETRACTIONS_PER_MIN_HIGH:
        return None
    current = conservativeness(ctx.info)
    if current >= SATURATED_CONSERVATIVENESS:
        return Option(
            title=f"schedule_conservativeness above {current:g}",
            change={},
            verdict="not_useful",
            predicted_max_total_num_tokens=None,
            predicted_gain=None,
            risk="none",
            reasons=[
                f"{rpm:.1f} retractions/min, but schedule_conservativeness {current:g} already "
                f"reserves all of running requests' remaining output at first (the initial "
                f"new_token_ratio is min(0.7 x value, 1.0), saturated from "
                f"{CONSERVATIVENESS_SATURATION:.2f}): raising it changes nothing"
            ],
        )
    return _conservativeness(ctx, MORE_CAUTIOUS, bottleneck)


def eager_admission(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    """Lower conservativeness where admission is the suspect, or where the ratio's reservation,
    not the tokens held, fills the pool of a server that does not retract; never for
    fixed-length requests (0.5.23 does not apply the ratio to them) or for a grammar queue."""
    if grammar_waiting(ctx.m):
        return None
    if bottleneck == "kv_cache":
        s = signals(ctx)
        r = s.reservation
        if kv_bound(s) is not None or s.retracting or r is None or r.fixed_length:
            return None
    elif bottleneck != "unknown":
        return None
    return _conservativeness(ctx, MORE_EAGER, bottleneck)


def pinned(ctx: Context, change: dict[str, Any]) -> dict[str, Any]:
    """The change with today's fraction written out where SGLang would otherwise re-derive it.

    With `--mem-fraction-static` unset SGLang computes it from the chunked prefill size, the
    decode CUDA-graph batch (capped by `--max-running-requests`) and the attention-DP size
    (`arg_groups/memory_hook.py::handle_gpu_memory_settings`), so a trial of any of them would
    also move the fraction and the pool, and the experiment would measure two changes at once.
    """
    if "mem_fraction_static" in change or not COUPLED.intersection(change):
        return change
    return {**change, "mem_fraction_static": ctx.cap.mem_fraction_static}


def larger_batch(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    """Twice the cap: `--max-running-requests` is global over attention-DP ranks (SGLang
    divides it by their number) but each `--dp-size` replica's own, so twice today's total,
    per replica."""
    limit = running_cap_total(ctx.info)
    if bottleneck != "compute" or not limit:
        return None
    flag = limit * 2 // dp_replicas(ctx.info)
    return evaluate(pinned(ctx, {"max_running_requests": flag}), ctx, bottleneck)


GRAPH_BATCH_STEP = 16


def decode_graphs(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    """Graphs that cover the decode batch where it runs eagerly beyond them (0.5.23's
    `--cuda-graph-max-bs-decode`; a busy server only)."""
    info = ctx.info
    if ctx.version < (0, 5, 23) or bottleneck not in ("compute", "kv_cache"):
        return None
    if info.arg("disable_cuda_graph") or str(info.arg("cuda_graph_backend_decode")) == "disabled":
        return None
    now = decode_max_bs(info, ctx.cap.gpu.total_mib or ctx.cap.gpu.pre_gib * 1024)
    per_rank = ctx.m.running / attn_dp_size(info)
    if per_rank <= now:
        return None
    wanted = min(4096, math.ceil(per_rank / GRAPH_BATCH_STEP) * GRAPH_BATCH_STEP)
    return evaluate(pinned(ctx, {"cuda_graph_max_bs_decode": wanted}), ctx, bottleneck)


def prefix_order(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    """Longest-prefix-match admission where prefixes are shared and the queue is short enough
    for SGLang to match them."""
    if ctx.info.arg("schedule_policy") not in (None, "fcfs"):
        return None
    if bottleneck not in ("kv_cache", "prefill") or not prefix_heavy(ctx.m):
        return None
    if ctx.m.queued > LPM_QUEUE_LIMIT:
        return None
    return evaluate({"schedule_policy": "lpm"}, ctx, bottleneck)


def dp_attention(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    """MLA holds its whole latent on every TP rank: attention DP over the TP ranks turns one
    pool per TP group into one per rank (0.5.23's `--attn-dp-size`)."""
    ranks_now = attn_dp_size(ctx.info)
    tp = ctx.info.tp_size
    if bottleneck != "kv_cache" or not ctx.cap.mla or tp <= 1 or ranks_now >= tp:
        return None
    if ctx.version < (0, 5, 23):
        return None  # the older --enable-dp-attention spelling is not an argument kvpilot edits
    return evaluate(pinned(ctx, {"attn_dp_size": tp}), ctx, bottleneck)


# In the order the options are listed before sorting by verdict.
PROPOSALS: tuple[Proposal, ...] = (
    more_clients,
    safe_fraction,
    smaller_chunk_fraction,
    closest_fraction,
    next_fraction,
    fp8_kv,
    hicache_proposal,
    fewer_retractions,
    eager_admission,
    larger_batch,
    dp_attention,
    prefix_order,
    decode_graphs,
)


def propose(ctx: Context, bottleneck: Bottleneck) -> list[Option]:
    """Every change a rule proposes for this server and bottleneck, each with its verdict."""
    return kit.propose(PROPOSALS, ctx, bottleneck)
