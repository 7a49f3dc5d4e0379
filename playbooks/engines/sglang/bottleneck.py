"""What limits an SGLang server: the measured evidence, then an ordered table of bottleneck rules.

The first rule that matches names the bottleneck, so the order is the priority: a server nobody
queues for is client-bound whatever else is true; requests waiting for their grammar to compile
are not helped by any KV change; a full KV pool outranks the running-request cap, which SGLang
checks before a pool full of reservations for running requests' remaining output; and an
admission that looks too cautious is what is left when nothing else explains a queue.
"""

from __future__ import annotations

from dataclasses import dataclass

from playbooks.engines.kit import bottleneck as kit
from playbooks.engines.kit.bottleneck import FILLING_RISE
from playbooks.engines.sglang.deployment import dp_replicas
from playbooks.engines.sglang.facts import (
    SATURATED_USAGE,
    Context,
    conservativeness,
    grammar_waiting,
    is_retracting,
    pool_tokens,
    requests_fitting,
    reservation_binding,
    resident_tokens,
    retraction_rate,
    running_cap_total,
)
from playbooks.engines.sglang.metrics import binding_pool
from playbooks.engines.sglang.reservation import (
    CLIP_MAX_NEW_TOKENS,
    Reservation,
    floor_ratio,
    initial_ratio,
)
from playbooks.engines.types import Measurement

RETRACTING_USAGE = 0.7  # with retractions, a pool this full already limits admission
PREFILL_RATIO = 4.0  # prompt tokens per output token beyond which prefill dominates

KV_FULL = kit.KvFull(SATURATED_USAGE, RETRACTING_USAGE, pool="KV pool", evicted="retracted")


@dataclass(frozen=True)
class Signals:
    """The measured numbers the bottleneck rules compare, read once."""

    m: Measurement
    usage: float | None  # where usage got to: a filling server is judged by its end, not its ramp
    usage_text: str  # the window's mean usage as reported
    retracting: bool
    running_cap: int | None
    reservation: Reservation | None = None  # the running requests' reserve, where it fills the pool


def signals(ctx: Context) -> Signals:
    m = ctx.m
    usage, usage_text = kit.usage_reached(m)
    return Signals(
        m=m,
        usage=usage,
        usage_text=usage_text,
        retracting=is_retracting(m),
        running_cap=running_cap_total(ctx.info),
        reservation=reservation_binding(ctx.info, ctx.version, m),
    )


def evidence(ctx: Context) -> list[str]:
    """What was measured, in the operator's words, before any conclusion."""
    m = ctx.m
    cap = pool_tokens(ctx.info)
    ranks = cap // max(1, ctx.info.max_total_num_tokens)
    usage = "unknown" if m.token_usage is None else f"{m.token_usage:.2f}"
    per_rank = ctx.info.max_total_num_tokens
    kind = "--dp-size replicas" if dp_replicas(ctx.info) > 1 else "DP-attention ranks"
    split = f" ({ranks} {kind} of {per_rank:,})" if ranks > 1 else ""
    found = [
        f"on average {m.running:.1f} requests ran and {m.queued:.1f} waited "
        f"(queue non-empty {m.queue_nonempty_fraction:.0%} of the time, at most "
        f"{m.queued_max:.0f}); KV token usage {usage} of {cap:,} tokens{split}"
    ]
    per = resident_tokens(ctx.info, m)
    if per is not None and m.avg_output_tokens is not None and m.avg_prompt_tokens is not None:
        found.append(
            f"completed requests averaged {m.avg_prompt_tokens:,.0f} prompt + "
            f"{m.avg_output_tokens:,.0f} output tokens; a running request holds ~{per:,.0f} "
            f"tokens of KV, so ~{requests_fitting(ctx.info, m):.0f} fit in {cap:,} tokens"
        )
    if m.usage_trend is not None and m.usage_trend[1] - m.usage_trend[0] > FILLING_RISE:
        found.append(
            f"token usage rose from {m.usage_trend[0]:.2f} to {m.usage_trend[1]:.2f} during the "
            "window: the server is still filling up (recent restart or a new burst); measure "
            "again in a few minutes for a settled picture"
        )
    pools = pools_evidence(m, reserved=reservation_binding(ctx.info, ctx.version, m) is not None)
    if pools is not None:
        found.append(pools)
    rpm = retraction_rate(m)
    if rpm is not None:
        found.append(f"{m.retractions} retractions in {m.window_s / 60:.1f} min ({rpm:.1f}/min)")
    elif m.retractions_seen_in_gauge:
        found.append(f"retractions seen in {m.retractions_seen_in_gauge} scrapes")
    return found + cache_evidence(m) + admission_evidence(ctx)


def cache_evidence(m: Measurement) -> list[str]:
    """What the prefix cache lost and the host tier gave back, where SGLang counts them."""
    found = []
    minutes = m.window_s / 60
    if m.evicted_tokens:
        found.append(
            f"{m.evicted_tokens:,} tokens of cached prefixes were evicted from the GPU in "
            f"{minutes:.1f} min ({m.evicted_tokens / m.window_s:,.0f}/s)"
        )
    if m.loaded_back_tokens:
        found.append(
            f"{m.loaded_back_tokens:,} tokens were loaded back from the host tier (HiCache) "
            f"in {minutes:.1f} min instead of being computed again"
        )
    return found


def admission_evidence(ctx: Context) -> list[str]:
    """The admission signals SGLang exports: its reserve ratio and the grammar queue."""
    m, found = ctx.m, []
    if m.new_token_ratio is not None:
        c = conservativeness(ctx.info)
        found.append(
            f"admission reserved {m.new_token_ratio:.2f} of running requests' remaining output "
            f"(new_token_ratio; {initial_ratio(c):.2f} after an idle spell at "
            f"schedule_conservativeness {c:g}, settling to {floor_ratio(c):.3f})"
        )
    if m.grammar_queued:
        found.append(
            f"{m.grammar_queued:.1f} requests on average waited for a structured-output grammar "
            "to compile before joining the queue"
        )
    return found


def client_bound(s: Signals) -> str | None:
    return kit.nothing_waits(s.m, other_waits=(s.m.grammar_queued or 0) >= 1)


def kv_bound(s: Signals) -> str | None:
    return KV_FULL.says(s.usage, s.retracting)


def grammar_bound(s: Signals) -> str | None:
    if not grammar_waiting(s.m):
        return None
    return (
        f"{s.m.grammar_queued:.1f} requests waited for their grammar to compile, against "
        f"{s.m.queued:.1f} for KV: grammar compilation is CPU work before admission, so no "
        "KV-cache or admission change shortens that wait"
    )


POOL_NAMES = {
    "full": "the full-attention pool",
    "swa": "the sliding-window (SWA) pool",
    "mamba": "the mamba state pool",
}


def pools_evidence(m: Measurement, *, reserved: bool = False) -> str | None:
    """For a hybrid model, each pool's share and which binds (0.5.23's token_usage is their
    maximum, `scheduler_components/pool_stats_observer.py`)."""
    # SGLang exports the SWA and mamba gauges for every model (0 for a plain one): a model is
    # hybrid where it has an SWA pool or either gauge reads above zero
    if not (m.swa_capacity_tokens or (m.swa_usage or 0) > 0 or (m.mamba_usage or 0) > 0):
        return None
    shares = ", ".join(
        f"{name} {value:.0%}"
        for name, value in (("full", m.full_usage), ("SWA", m.swa_usage), ("mamba", m.mamba_usage))
        if value is not None
    )
    # near full as the KV rule reads it: with retractions a pool this full already limits
    # admission (`kv_bound`), so the evidence names the same pool the bottleneck was read from
    # `reserved`: the running requests' reservations fill the pool (`reservation_bound`), so
    # the fullest pool binds however much of it is in use
    near_top = RETRACTING_USAGE if is_retracting(m) else SATURATED_USAGE
    pool = binding_pool(m.full_usage, m.swa_usage, m.mamba_usage, 0.0 if reserved else near_top)
    verdict = f"{POOL_NAMES[pool]} binds" if pool is not None else "none of them is near full"
    if pool is not None and reserved:
        verdict += " (by its reservations)"
    return f"hybrid model, pool usage {shares}: {verdict}"


def reservation_bound(s: Signals) -> str | None:
    r = s.reservation
    if r is None:
        return None
    if r.basis == "max_tokens":
        return (
            f"the pool is only {r.usage:.0%} in use, yet it is full of reservations if the "
            f"clients send max_tokens well above their answers (~{r.answer:,.0f} tokens) or "
            "none: SGLang reserves for what a request may still generate, not for its answer, "
            f"up to {CLIP_MAX_NEW_TOKENS:,} tokens ({r.ratio:.2f} of it for each running "
            f"request, {r.ratio_source}), and admits the next only with its whole limit free. "
            f"{r.running:.0f} running reserve ~{r.reserved:,.0f} tokens, the next needs "
            f"~{r.next_need:,.0f}, {r.held:,.0f} are held, of {r.pool:,}. kvpilot cannot see "
            "max_tokens; clients sending limits near their answers would let more run: "
            "admission is limited by KV-cache capacity"
        )
    how = (
        "SGLang 0.5.23 reserves all that is left of a fixed-length request (ignore_eos with "
        "max_tokens), whatever new_token_ratio says"
        if r.fixed_length
        else f"{r.ratio:.2f} of it each, {r.ratio_source}"
    )
    return (
        f"{r.running:.0f} running requests reserve ~{r.reserved:,.0f} tokens for their remaining "
        f"output ({how}); with {r.held:,.0f} held the pool of {r.pool:,} is full of "
        f"reservations although only {r.usage:.0%} is in use: admission is limited by KV-cache "
        "capacity"
    )


def running_cap_bound(s: Signals) -> str | None:
    if s.running_cap and s.m.running >= 0.95 * s.running_cap:
        return (
            f"the batch is at max_running_requests ({s.running_cap}) while the KV "
            "pool has room: the running-request cap limits the batch"
        )
    return None


def prefill_bound(s: Signals) -> str | None:
    return kit.prompts_dominate(s.m, PREFILL_RATIO, "the pool has room: prefill limits")


def admission_bound(s: Signals) -> str:
    """What is left when requests wait and nothing above explains it."""
    return (
        f"requests wait although the KV pool is only {s.usage_text} used: SGLang's "
        "admission looks too conservative (its guide suggests a lower "
        "--schedule-conservativeness)"
    )


# SGLang's own rows, after every engine's first three (`kit.Table`). A batch at its cap is
# refused before the token budget is asked (managers/scheduler.py `_get_new_batch_prefill_raw`
# checks `get_num_allocatable_reqs` before the PrefillAdder).
RULES: kit.Rows[Signals] = (
    ("compute", running_cap_bound),
    ("kv_cache", reservation_bound),
    ("prefill", prefill_bound),
)


# In priority order: the first rule that matches names the bottleneck.
TABLE = kit.Table(signals, evidence, client_bound, grammar_bound, kv_bound, RULES, admission_bound)
analyse = TABLE.analyse
