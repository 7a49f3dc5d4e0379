"""A change's verdict from its checks: `evaluate` with a measurement, `judge_change` without.

Both run the same safety halves, so `--consider KEY=VALUE`, the bot's own proposals and an
experiment's pre-flight agree on what is unsafe. The worst verdict of the parts wins; a part that
is unsafe is not asked whether it would also be useful (`playbooks.engines.findings`).
"""

from __future__ import annotations

from typing import Any

from playbooks.engines.findings import (
    NOTHING_AGAINST,
    BatchLimits,
    Finding,
    capped_by,
    collect,
    kv_capacity_gain,
    option_of,
    worst,
)
from playbooks.engines.types import Bottleneck, Option, Verdict
from playbooks.engines.vllm.arguments import checks_for
from playbooks.engines.vllm.checks import Change
from playbooks.engines.vllm.facts import Context, Observed, Server


def findings_of(change: Change, seen: Observed | None) -> list[Finding]:
    return collect(checks_for(change), change, seen)


def batch_limits(change: Change, seen: Observed) -> BatchLimits | None:
    """What bounds the batch after the change (`BatchLimits`); None where kvpilot cannot
    predict the gain (the capacity is not predicted, or an argument changes more than the KV
    pool and the caps on the batch)."""
    if change.tokens is None or not all(c.predicts_gain_for(change) for c in checks_for(change)):
        return None
    m = seen.m
    return BatchLimits(m.running, m.queued, change.current, change.tokens, change.batch_caps)


def option(
    change: Change,
    found: list[Finding],
    verdict: Verdict,
    gain: tuple[float, float] | None,
    considered: bool,
) -> Option:
    return option_of(change.values, change.tokens, found, verdict, gain, considered)


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
    gain = None if limits is None else kv_capacity_gain(limits, seen.kv_bound)
    return option(proposed, found, verdict, gain, considered)


def judge_change(server: Server, change: dict[str, Any]) -> Option:
    """The safety verdict for one change, before anything is measured (an experiment's check):
    `unsafe` or `needs_opt_in` where a check says so, otherwise `possible`."""
    proposed = Change.of(server, change)
    found = findings_of(proposed, None)
    verdict = worst(found, "possible")
    if not any(f.verdict is not None for f in found):
        found.append(Finding(reasons=(NOTHING_AGAINST,)))
    return option(proposed, found, verdict, None, considered=True)
