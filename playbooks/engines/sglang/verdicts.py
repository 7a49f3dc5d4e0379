"""A change's verdict from its checks: `evaluate` with a measurement, `judge_change` without.

Both run the same safety halves, so `--consider KEY=VALUE`, the bot's own proposals and an
experiment's pre-flight agree on what is unsafe. The worst verdict of the parts wins; a part that
is unsafe is not asked whether it would also be useful.
"""

from __future__ import annotations

from typing import Any

from playbooks.engines.findings import (
    NOTHING_AGAINST,
    RESTART_RISK,
    BatchLimits,
    Finding,
    capped_by,
    collect,
    kv_capacity_gain,
    option_of,
    worst,
)
from playbooks.engines.sglang.arguments import checks_for
from playbooks.engines.sglang.checks import Change
from playbooks.engines.sglang.facts import Context, Observed, Server
from playbooks.engines.timebudget import Traffic
from playbooks.engines.types import Bottleneck, Option, Verdict

__all__ = ["NOTHING_AGAINST", "RESTART_RISK", "evaluate", "judge_change", "worst"]
# The hierarchical cache is switched on with its size: the title names the size alone.
IMPLIED = frozenset({"enable_hierarchical_cache"})


def findings_of(change: Change, seen: Observed | None) -> list[Finding]:
    return collect(checks_for(change), change, seen)


def batch_limits(change: Change, seen: Observed) -> BatchLimits | None:
    """What bounds the batch after the change (`BatchLimits`); None where an argument changes
    something the capacity model cannot predict throughput for."""
    if not all(check.predicts_gain_for(change) for check in checks_for(change)):
        return None
    m = seen.m
    return BatchLimits(m.running, m.queued, change.current, change.tokens, change.batch_caps)


def capacity_gain(
    change: Change, seen: Observed, limits: BatchLimits | None
) -> tuple[float, float] | None:
    """Throughput change from more KV room (`kv_capacity_gain`), where it can be predicted."""
    if limits is None:
        return None
    return kv_capacity_gain(
        limits, seen.kv_bound, seen.m.time_budget,
        change.bytes_per_token / change.cap.bytes_per_token, traffic_of(change, seen),
    )  # fmt: skip


def traffic_of(change: Change, seen: Observed) -> Traffic | None:
    """What a decode step reads per GPU today: the weights SGLang reports and the pool's
    share in use over the window. Only for a model its config.json shows dense: an MoE step
    reads more experts as its batch grows, so its weights are no fixed cost, and where the
    config is out of reach kvpilot cannot tell which it is. None otherwise, or where the
    weights or the usage are unknown."""
    cap, usage = change.cap, seen.m.token_usage
    dense = cap.geometry is not None and cap.geometry.routed_experts == 0
    if not dense or cap.weights_gib is None or usage is None:
        return None
    return Traffic(cap.weights_gib, usage * cap.kv_gib)


def option(
    change: Change,
    found: list[Finding],
    verdict: Verdict,
    gain: tuple[float, float] | None,
    considered: bool,
) -> Option:
    return option_of(
        change.values, change.tokens, found, verdict, gain, considered, IMPLIED,
        static_gpu_gib(change),
    )  # fmt: skip


def static_gpu_gib(change: Change) -> float | None:
    """GPU memory per GPU the change adds to the pool and the cache's buffers (what stays
    outside them shrinks by as much); None where it adds nothing."""
    cap = change.cap
    extra = cap.outside_now_gib - cap.outside_gib(
        change.fraction, change.bytes_per_token, change.hicache
    )
    return round(extra, 3) if extra > 0 else None


def evaluate(
    change: dict[str, Any], ctx: Context, bottleneck: Bottleneck, considered: bool = False
) -> Option:
    """Judge one change against a measured server: safe, and does it address the bottleneck."""
    proposed = Change.of(ctx.server, change)
    seen = Observed(ctx.m, bottleneck)
    limits = batch_limits(proposed, seen)
    found = findings_of(proposed, seen)
    verdict = worst(found, "not_useful")
    found.append(capped_by(limits, seen.kv_bound, verdict))
    return option(proposed, found, verdict, capacity_gain(proposed, seen, limits), considered)


def judge_change(server: Server, change: dict[str, Any]) -> Option:
    """The safety verdict for one change, before anything is measured (an experiment's check).

    Only the safety halves run: `unsafe` or `needs_opt_in` where a check says so, otherwise
    `possible`, since whether it helps is what the experiment is for.
    """
    proposed = Change.of(server, change)
    found = findings_of(proposed, None)
    verdict = worst(found, "possible")
    if not any(f.verdict is not None for f in found):
        found.append(Finding(reasons=(NOTHING_AGAINST,)))
    return option(proposed, found, verdict, None, considered=True)
