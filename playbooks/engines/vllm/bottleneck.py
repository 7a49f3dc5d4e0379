"""What limits a vLLM server: the measured evidence, then an ordered table of bottleneck rules.

The first rule that matches names the bottleneck, so the order is the priority. vLLM's scheduler
(v1/core/sched/scheduler.py `Scheduler.schedule`) serves running requests first and preempts the
newest when a running request needs a block it cannot get; it admits waiting requests only while
nothing was preempted in the step, fewer than `max_num_seqs` run, the step's token budget
(`max_num_batched_tokens`) has room and the prompt's blocks fit. So:

1. nobody waits (and nobody was refused at admission): the clients are the limit;
2. most of the waiting requests are deferred (a LoRA budget, a KV transfer, a blocked status),
   not held for room: no KV change helps (`unknown`);
3. the block pool is (nearly) full, or requests are being preempted with a full-ish pool: KV;
4. the batch is at `max_num_seqs` while blocks are free: the sequence cap (compute);
5. a waiting prompt does not fit the free blocks (admission needs the whole prompt): KV;
6. prompts dominate the work: prefill (the token budget);
7. otherwise the wait is not explained by what vLLM exports.
"""

from __future__ import annotations

from dataclasses import dataclass

from playbooks.engines.kit import bottleneck as kit
from playbooks.engines.kit.bottleneck import FILLING_RISE
from playbooks.engines.types import Measurement
from playbooks.engines.vllm.facts import (
    PREEMPTING_USAGE,
    PROMPT_HEAVY,
    SATURATED_USAGE,
    Context,
    free_tokens_per_engine,
    is_preempting,
    preemption_rate,
    prompt_waits_for_blocks,
    requests_fitting,
    resident_tokens,
    seq_cap_name,
    seq_cap_total,
)

DEFERRED_SEEN = 0.5  # mean deferred requests worth naming in the evidence

KV_FULL = kit.KvFull(SATURATED_USAGE, PREEMPTING_USAGE, pool="KV cache", evicted="preempted")


@dataclass(frozen=True)
class Signals:
    """The measured numbers the bottleneck rules compare, read once."""

    m: Measurement
    usage: float | None  # where usage got to: a filling server is judged by its end
    usage_text: str
    preempting: bool
    seq_cap: int | None
    seq_cap_flag: str  # the flag that sets it (`facts.seq_cap_name`)
    prompt_waits: bool  # a waiting prompt is larger than the free blocks
    free_tokens: float | None  # per engine


def signals(ctx: Context) -> Signals:
    m = ctx.m
    usage, usage_text = kit.usage_reached(m)
    return Signals(
        m,
        usage,
        usage_text,
        is_preempting(m),
        seq_cap_total(ctx.info),
        seq_cap_name(ctx.info),
        prompt_waits_for_blocks(ctx.info, m),
        free_tokens_per_engine(ctx.info, m),
    )


def evidence(ctx: Context) -> list[str]:
    """What was measured, in the operator's words, before any conclusion."""
    m, info = ctx.m, ctx.info
    cap = info.capacity_tokens
    usage = "unknown" if m.token_usage is None else f"{m.token_usage:.2f}"
    split = f" ({info.engines} data-parallel engines)" if info.engines > 1 else ""
    found = [
        f"on average {m.running:.1f} requests ran and {m.queued:.1f} waited "
        f"(queue non-empty {m.queue_nonempty_fraction:.0%} of the time, at most "
        f"{m.queued_max:.0f}); KV cache usage {usage} of {cap:,} tokens{split}"
    ]
    per = resident_tokens(info, m)
    if per is not None and m.avg_output_tokens is not None and m.avg_prompt_tokens is not None:
        fit = requests_fitting(info, m) or 0.0
        found.append(
            f"completed requests averaged {m.avg_prompt_tokens:,.0f} prompt + "
            f"{m.avg_output_tokens:,.0f} output tokens; a running request holds ~{per:,.0f} "
            f"tokens of KV, so ~{fit:.0f} fit in {cap:,} tokens"
        )
    if m.usage_trend is not None and m.usage_trend[1] - m.usage_trend[0] > FILLING_RISE:
        found.append(
            f"KV usage rose from {m.usage_trend[0]:.2f} to {m.usage_trend[1]:.2f} during the "
            "window: the server is still filling up (recent restart or a new burst); measure "
            "again in a few minutes for a settled picture"
        )
    rpm = preemption_rate(m)
    if rpm is not None:
        found.append(
            f"{m.retractions} preemptions in {m.window_s / 60:.1f} min ({rpm:.1f}/min): vLLM "
            "frees a preempted request's blocks and computes it again from the start"
        )
    if (m.deferred_queued or 0) >= DEFERRED_SEEN:
        found.append(
            f"{m.deferred_queued:.1f} of the {m.queued:.1f} waiting were deferred "
            "(num_requests_waiting_by_reason): held back for a LoRA budget, a KV transfer or a "
            "blocked status (a structured-output grammar compiling, remote KV arriving), not "
            "for room in the KV cache"
        )
    if m.loaded_back_tokens:
        found.append(
            f"{m.loaded_back_tokens:,} prompt tokens came from the KV connector (KV offloading "
            f"to the CPU, or another instance) in {m.window_s / 60:.1f} min instead of being "
            "computed again (external_prefix_cache_hits)"
        )
    if m.rejections:
        found.append(
            f"{m.rejections:,} requests were refused at admission (HTTP 503, "
            "admission_rejections) in the window: --max-num-queued-reqs or "
            "--max-num-queued-tokens was reached, so clients offered more than the waiting "
            "count shows"
        )
    cap_now = seq_cap_total(info)
    if cap_now is None:
        found.append(
            "max_num_seqs is not known (vLLM exports no scheduler settings without "
            "VLLM_SERVER_DEV_MODE=1 and kvpilot did not launch it), so the sequence cap is "
            "not judged"
        )
    return found


def client_bound(s: Signals) -> str | None:
    return kit.nothing_waits(s.m, other_waits=bool(s.m.rejections))


def deferred_bound(s: Signals) -> str | None:
    deferred = s.m.deferred_queued or 0.0
    if deferred < 1 or deferred < s.m.queued - deferred:
        return None
    return (
        f"{deferred:.1f} of the {s.m.queued:.1f} waiting requests were deferred by vLLM, not "
        "held for KV room (a LoRA budget, a KV transfer, a grammar compiling or remote KV "
        "arriving): no KV-cache or batch-size change shortens that wait"
    )


def kv_bound(s: Signals) -> str | None:
    return KV_FULL.says(s.usage, s.preempting)


def seq_cap_bound(s: Signals) -> str | None:
    if s.seq_cap and s.m.running >= 0.95 * s.seq_cap:
        said = (
            f"the batch is at {s.seq_cap_flag} ({s.seq_cap}) while the KV cache has room: the "
            "sequence cap limits the batch"
        )
        if s.seq_cap_flag == "max_num_active_seqs":
            said += (
                " (below max_num_seqs, which only sizes the runner; kvpilot does not edit it: "
                "raise --max-num-active-seqs by hand)"
            )
        return said
    return None


def prompt_bound(s: Signals) -> str | None:
    if not s.prompt_waits or s.free_tokens is None or s.m.avg_prompt_tokens is None:
        return None
    return (
        f"a waiting prompt (~{s.m.avg_prompt_tokens:,.0f} tokens) is larger than the "
        f"~{s.free_tokens:,.0f} free tokens of KV cache: vLLM admits a request only when its "
        "whole prompt fits, and none behind it (first come, first served), so admission is "
        "limited by KV-cache capacity although usage is below the top"
    )


def prefill_bound(s: Signals) -> str | None:
    where = "the KV cache has room: prefill, within each step's token budget "
    return kit.prompts_dominate(s.m, PROMPT_HEAVY, where + "(max_num_batched_tokens), limits")


# vLLM's own rows, after every engine's first three (`kit.Table`), in the order above (4 to 6).
RULES: kit.Rows[Signals] = (
    ("compute", seq_cap_bound),
    ("kv_cache", prompt_bound),
    ("prefill", prefill_bound),
)


def unexplained(s: Signals) -> str:
    """What is left when requests wait and nothing above explains it."""
    reasons = (
        ""
        if s.m.deferred_queued is not None
        else " and the waiting queue's reasons (num_requests_waiting_by_reason, vLLM 0.32 on)"
    )
    return (
        f"requests wait although the KV cache is only {s.usage_text} used and no rule above "
        f"explains it: check max_num_seqs{reasons} on the server"
    )


# In priority order: the first rule that matches names the bottleneck.
TABLE = kit.Table(signals, evidence, client_bound, deferred_bound, kv_bound, RULES, unexplained)
analyse = TABLE.analyse
