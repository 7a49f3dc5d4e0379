"""When a condition becomes an alert, and when the alert is over: hysteresis, as a pure step.

A condition (a server KV-bound, its throughput down against a week before) is judged at every
look. It is raised once it has held for `raise_after_s` without a break, and cleared once it
has been absent for `clear_after_s` without a break; a look that cannot judge (no samples, the
server down) changes nothing. So a condition that flickers around its threshold is posted
once, not at every sample, and posted again only after it has really gone.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

Transition = Literal["raise", "clear"] | None


@dataclass(frozen=True)
class AlertState:
    active: bool  # raised and not cleared
    since: float  # when the condition began to hold (this streak)
    clear_since: float | None = None  # raised, and absent since then


def step(
    prev: AlertState | None,
    holds: bool | None,
    now: float,
    raise_after_s: float,
    clear_after_s: float,
) -> tuple[AlertState | None, Transition]:
    """The state after one look, and whether the alert is raised or cleared by it."""
    if holds is None:
        return prev, None
    if holds:
        if prev is None:
            prev = AlertState(False, now)
        if prev.active:
            return replace(prev, clear_since=None), None
        if now - prev.since >= raise_after_s:
            return AlertState(True, prev.since), "raise"
        return prev, None
    if prev is None or not prev.active:
        return None, None  # a streak that had not been raised yet is simply over
    gone = prev.clear_since if prev.clear_since is not None else now
    if now - gone >= clear_after_s:
        return None, "clear"
    return replace(prev, clear_since=gone), None


def regressed(now_rate: float | None, week_rate: float | None, share: float) -> bool | None:
    """Whether throughput fell by more than `share` against the same hours a week before;
    None where either side is unknown or there was nothing to compare with."""
    if share <= 0 or now_rate is None or week_rate is None or week_rate <= 0:
        return None
    return now_rate < (1 - share) * week_rate
