"""How an engine's checks of a change answer and combine, whatever the engine.

Every engine judges a change the same way: each launch argument's check has a safety half (will
it start, will it run out of memory, does it cost accuracy: the server's facts suffice, so an
experiment's pre-flight can ask it) and a usefulness half (does it address what a measurement
shows). Each half answers with a `Finding`; the worst verdict of the parts wins. What the checks
*are* is the engine's; the answer type, the combination, the title of an option and the
throughput a larger KV pool may buy are the same for all, so they live here once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from playbooks.engines.timebudget import KV_COST, TimeBudget, Traffic
from playbooks.engines.types import VERDICT_ORDER, Option, Verdict

# How far the time-budget model's point errs, as measured against the twin's long-run effects
# (`bench.tune`, BENCHMARKS.md "Tuning against an oracle"): a smaller prefill chunk adds
# prefill steps the model does not count, so effects fall short of it more than they exceed it.
MODEL_LOW = 0.6
MODEL_HIGH = 1.3
# Without any model of a step, the share of the batch's growth a larger pool turns into
# throughput at worst. Measured: the incident twin 46 -> 64 running (+38%) for +16% long-run
# (0.42), the real H100 57 -> 150 (+163%) for +48% (0.29), the real H200 96 -> 150 (+56%) for
# +12% steady (0.21). The rule said a half, above all three: a fifth holds them.
BATCH_SHARE_AT_WORST = 0.2
# The share of its KV pool a server holds once the pool, not a cap, limits its batch: SGLang
# keeps part of the pool for running requests' growth (its new-token ratio). Measured on the
# H100 under 150 clients: 0.888 at fraction 0.30 and 0.919 at 0.45 (tests/fixtures/gpu, ab-*).
FULL_POOL_USAGE = 0.9
RESTART_RISK = "restart: the server is down while it reloads the model"
NOTHING_AGAINST = "no safety check objects to it; the experiment measures whether it helps"


@dataclass(frozen=True)
class Finding:
    """One half's answer: a verdict where it has one, and the sentences and risks behind it."""

    verdict: Verdict | None = None
    reasons: tuple[str, ...] = ()
    risks: tuple[str, ...] = ()


NOTHING = Finding()


def worst(findings: Iterable[Finding], default: Verdict) -> Verdict:
    """The combined verdict: the worst of the parts', `default` where no part has one."""
    verdicts = [f.verdict for f in findings if f.verdict is not None]
    return min(verdicts, key=lambda v: VERDICT_ORDER[v]) if verdicts else default


def title(change: Mapping[str, Any], implied: frozenset[str] = frozenset()) -> str:
    """An option's title: the change as `key=value` pairs. `implied` names on/off arguments an
    engine switches on together with another one, left out of the title when set alongside."""
    if not change:
        return "no server change"
    parts = []
    for k, v in change.items():
        if k in implied and v is True and len(change) > 1:
            continue
        if isinstance(v, bool):
            text = str(v).lower()
        elif isinstance(v, float):
            text = f"{v:g}"
        else:
            text = str(v)
        parts.append(f"{k}={text}")
    return ", ".join(parts)


@dataclass(frozen=True)
class BatchCap:
    """A setting that caps how many requests one step runs, as it stands after a change.

    `setting` names it as the operator sets it (with how the engine applies it, per rank or
    per engine, where that matters); `requests` is what it lets run over the whole server."""

    setting: str
    requests: int


@dataclass(frozen=True)
class BatchLimits:
    """What bounds the running batch after a change: the clients (those running and those
    waiting now), the KV pool (its growth), and every cap the engine applies to the batch.
    The batch grows to the tightest of them; a cap that is the tightest binds. `room` is how
    many times today's batch today's pool would hold where a cap, not the pool, limits it now
    (1 where the pool is full)."""

    running: float
    queued: float
    tokens_now: int
    tokens_new: int
    caps: tuple[BatchCap, ...] = ()
    room: float = 1.0

    def _uncapped(self) -> float:
        """The batch's growth were no cap in the way: to the clients' or the pool's limit."""
        pool = self.tokens_new / self.tokens_now * self.room
        return min((self.running + self.queued) / self.running, pool)

    def binding(self) -> BatchCap | None:
        """The cap the batch meets before the clients or the pool run out, if one does."""
        if self.running <= 0 or self.tokens_now <= 0:
            return None
        ratio = self._uncapped()
        tightest = min(self.caps, key=lambda c: c.requests, default=None)
        if tightest is None or tightest.requests / self.running >= ratio:
            return None
        return tightest

    def ratio(self) -> float:
        """How many times today's batch the batch after the change holds."""
        if self.running <= 0 or self.tokens_now <= 0:
            return 0.0
        cap = self.binding()
        if cap is not None:
            return cap.requests / self.running
        return self._uncapped()

    def reason(self) -> str | None:
        """The sentence an option carries where a cap binds, so the operator can raise it too."""
        cap = self.binding()
        if cap is None or cap.requests < self.running:  # a cut, said by the cap's own check
            return None
        return (
            f"the gain is capped by {cap.setting}: at most {cap.requests:,} requests run at "
            f"once, {self.ratio():.1f}x today's {self.running:.0f}; raise it with the pool for more"
        )


def capped_by(limits: BatchLimits | None, kv_bound: bool, verdict: Verdict) -> Finding:
    """The option's sentence where a cap on the batch bounds what a larger pool buys (none
    for an unsafe change, which is given no gain)."""
    reason = limits.reason() if limits is not None and kv_bound and verdict != "unsafe" else None
    return Finding(reasons=(reason,)) if reason else NOTHING


def kv_capacity_gain(
    limits: BatchLimits,
    kv_bound: bool,
    budget: TimeBudget | None = None,
    bytes_ratio: float = 1.0,
    traffic: Traffic | None = None,
) -> tuple[float, float]:
    """The throughput change a larger KV pool or a higher cap buys, as an interval meant to hold
    90% of effects.

    Where the KV cache is not what limits the server, more of it buys nothing; where it is, the
    batch grows with the pool until the queue is empty or a cap on the batch binds
    (`BatchLimits`). Where a cap holds the batch below what the pool holds, raising it grows the
    batch the same way, up to the pool's room. What a larger batch buys is read from the
    server's own time budget where it accounts for one (`timebudget`): only the decode share
    speeds up, and only by spreading each step's fixed cost over more requests. `bytes_ratio` is
    the new KV cell's size over the old one's (a KV dtype change): each request's part of a step
    then shrinks somewhere between not at all (compute) and that ratio (KV reads), so the
    interval spans both. Where what a step reads is known (`traffic`), the step's fixed part is
    the weights' share of it, a KV byte costing one to two weight bytes (`timebudget.KV_COST`),
    rather than the window's line over the batch, which a full pool leaves flat. Without a
    budget, a rule of thumb: the batch's growth at best, a fifth of it at worst
    (`BATCH_SHARE_AT_WORST`).
    """
    if limits.running <= 0 or limits.tokens_now <= 0:
        return (0.0, 0.0)
    ratio = limits.ratio()
    if ratio < 1:  # a cap below today's batch: it shrinks, KV-bound or not
        return batch_shrink_loss(ratio, budget, traffic)
    if not kv_bound and limits.room <= 1:  # nothing holds the batch back that this lifts
        return (0.0, 0.0)
    if budget is not None and traffic is None and not budget.line:
        budget = None  # a mean step with nothing to split it by: no model of the step
    if budget is None:
        high = max(0.0, ratio - 1)
        return (high * BATCH_SHARE_AT_WORST, high)
    cheap, dear = (
        (budget, budget)
        if traffic is None
        else (budget.split_by(traffic, KV_COST[0]), budget.split_by(traffic, KV_COST[1]))
    )
    low = max(0.0, dear.gain(ratio))
    high = max(low, cheap.gain(ratio, min(1.0, bytes_ratio)))
    return (low * MODEL_LOW, high * MODEL_HIGH)


def batch_shrink_loss(
    ratio: float, budget: TimeBudget | None = None, traffic: Traffic | None = None
) -> tuple[float, float]:
    """The throughput change when a cap cuts today's batch to `ratio` of it (below 1): the
    same step model as a growing batch's, read the other way, each step's fixed cost now spread
    over fewer requests. The interval's far end scales the model's larger loss by MODEL_HIGH and
    its near end the smaller loss by MODEL_LOW; without a model, the batch's shrink at worst and
    a fifth of it at best (`BATCH_SHARE_AT_WORST`). Measured on a real H100: 65 -> 40 running
    (a cap of 40 at 0.45) lost 30% at the gate and 28% steady."""
    if budget is not None and traffic is None and not budget.line:
        budget = None
    if budget is None:
        worst_loss = ratio - 1
        return (worst_loss, worst_loss * BATCH_SHARE_AT_WORST)
    models = (
        (budget,)
        if traffic is None
        else (budget.split_by(traffic, KV_COST[0]), budget.split_by(traffic, KV_COST[1]))
    )
    losses = [min(0.0, m.gain(ratio)) for m in models]
    return (min(losses) * MODEL_HIGH, max(losses) * MODEL_LOW)


def option_of(
    change: Mapping[str, Any],
    tokens: int | None,
    found: list[Finding],
    verdict: Verdict,
    gain: tuple[float, float] | None,
    considered: bool,
    implied: frozenset[str] = frozenset(),
    static_gpu_gib: float | None = None,
) -> Option:
    """The option a judged change becomes: its title, the predicted capacity (`tokens`), every
    part's reasons and risks (a restart's always), and a gain only where it is not unsafe. The
    reasons of the parts that decided the verdict come first: the operator reads why first."""
    found = sorted(found, key=lambda f: f.verdict != verdict)  # stable: table order otherwise
    risks = [risk for f in found for risk in f.risks] + [RESTART_RISK]
    return Option(
        title=title(change, implied),
        change=dict(change),
        verdict=verdict,
        predicted_max_total_num_tokens=tokens,
        predicted_gain=gain if verdict != "unsafe" else None,
        risk="; ".join(dict.fromkeys(risks)),
        reasons=[reason for f in found for reason in f.reasons],
        considered=considered,
        static_gpu_gib=static_gpu_gib,
    )


class CheckHalves(Protocol):
    """What every engine's check of one launch argument offers (its `Check` classes)."""

    fallback: bool

    def value(self, change: Any) -> Any: ...

    def safety(self, change: Any, value: Any) -> Finding: ...

    def usefulness(self, change: Any, value: Any, seen: Any) -> Finding: ...


def collect(checks: Sequence[CheckHalves], change: Any, seen: Any | None) -> list[Finding]:
    """Each check's safety half, then its usefulness half where there is a measurement and the
    part is not unsafe; a ride-along argument speaks only while no part has a verdict."""
    found: list[Finding] = []
    for check in checks:
        if check.fallback and any(f.verdict is not None for f in found):
            continue
        value = check.value(change)
        safety = check.safety(change, value)
        found.append(safety)
        if seen is not None and safety.verdict != "unsafe":
            found.append(check.usefulness(change, value, seen))
    return found
