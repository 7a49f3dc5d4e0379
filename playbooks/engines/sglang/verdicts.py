"""A change's verdict from its checks: `evaluate` with a measurement, `judge_change` without.

Both run the same safety halves, so `--consider KEY=VALUE`, the bot's own proposals and an
experiment's pre-flight agree on what is unsafe. The worst verdict of the parts wins; a part that
is unsafe is not asked whether it would also be useful.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from playbooks.engines.sglang.arguments import checks_for
from playbooks.engines.sglang.checks import Change, Finding
from playbooks.engines.sglang.facts import Context, Observed, Server
from playbooks.types import VERDICT_ORDER, Bottleneck, Option, Verdict

RESTART_RISK = "restart: the server is down while it reloads the model"
NOTHING_AGAINST = "no safety check objects to it; the experiment measures whether it helps"


def worst(findings: Iterable[Finding], default: Verdict) -> Verdict:
    """The combined verdict: the worst of the parts', `default` where no part has one."""
    verdicts = [f.verdict for f in findings if f.verdict is not None]
    return min(verdicts, key=lambda v: VERDICT_ORDER[v]) if verdicts else default


def findings_of(change: Change, seen: Observed | None) -> list[Finding]:
    """Each check's safety half, then its usefulness half where there is a measurement and the
    part is not unsafe; a ride-along argument speaks only while no part has a verdict."""
    found: list[Finding] = []
    for check in checks_for(change):
        if check.fallback and any(f.verdict is not None for f in found):
            continue
        value = check.value(change)
        safety = check.safety(change, value)
        found.append(safety)
        if seen is not None and safety.verdict != "unsafe":
            found.append(check.usefulness(change, value, seen))
    return found


def capacity_gain(change: Change, seen: Observed) -> tuple[float, float] | None:
    """Throughput change from more KV room: linear in running requests at best, half at worst.

    None where an argument changes something the capacity model cannot predict throughput for.
    """
    if not all(check.predicts_gain for check in checks_for(change)):
        return None
    m = seen.m
    if not seen.kv_bound or m.running <= 0:
        return (0.0, 0.0)
    running_new = min(m.running + m.queued, m.running * change.tokens / change.current)
    high = max(0.0, running_new / m.running - 1)
    return (high / 2, high)


def title(change: Mapping[str, Any]) -> str:
    if not change:
        return "no server change"
    parts = []
    for k, v in change.items():
        if k == "enable_hierarchical_cache" and v is True and len(change) > 1:
            continue
        if isinstance(v, bool):
            text = str(v).lower()
        elif isinstance(v, float):
            text = f"{v:g}"
        else:
            text = str(v)
        parts.append(f"{k}={text}")
    return ", ".join(parts)


def option(
    change: Change,
    found: list[Finding],
    verdict: Verdict,
    gain: tuple[float, float] | None,
    considered: bool,
) -> Option:
    risks = [risk for f in found for risk in f.risks] + [RESTART_RISK]
    return Option(
        title=title(change.values),
        change=dict(change.values),
        verdict=verdict,
        predicted_max_total_num_tokens=change.tokens,
        predicted_gain=gain if verdict != "unsafe" else None,
        risk="; ".join(dict.fromkeys(risks)),
        reasons=[reason for f in found for reason in f.reasons],
        considered=considered,
    )


def evaluate(
    change: dict[str, Any], ctx: Context, bottleneck: Bottleneck, considered: bool = False
) -> Option:
    """Judge one change against a measured server: safe, and does it address the bottleneck."""
    proposed = Change.of(ctx.server, change)
    seen = Observed(ctx.m, bottleneck)
    found = findings_of(proposed, seen)
    verdict = worst(found, "not_useful")
    return option(proposed, found, verdict, capacity_gain(proposed, seen), considered)


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
