"""Which change a campaign tries next, and what a failed step teaches (pure).

A campaign is a sequence of gated experiments on one server. After each verdict the engine's
rules assess the server again (from the trial's own measurement) and list their options; this
module picks one, or says why nothing is left. The order is expected gain per restart, then
risk: every step costs one restart (minutes of a big model's start and the running requests),
so the step with the most to gain goes first, and of two equal ones the safer.

Safety moves toward the modelled edge only on evidence. The engines label a change that keeps
the engine's own reserve `recommended` and one that spends part of it `possible`; a campaign
takes a `possible` step only after one of its steps was kept on this server (the server ran a
changed configuration under load and stayed up), never as its first move; where the server's
GPUs can be read, also only if the memory it left free under load holds what the step adds;
where it does not, the step is cut down to the largest memory fraction that fits, judged by the
same rules. A step that ran the server out of memory teaches a bound ("mem_fraction_static 0.91
died under load: out of memory"): kept per server and never proposed again without `force`.
A start still loading at the launcher's ready timeout, or a crash of another kind, teaches none.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from playbooks.campaigns.cutdown import Reassess, expected_gain, fitted, within_plan
from playbooks.campaigns.room import GpuRoom
from playbooks.engines.exits import Failure
from playbooks.engines.types import Option, Verdict
from playbooks.experiments.failures import teaches_about_memory

# Causes (playbooks.experiments.outcome.CAUSES keys) that may say the configuration itself
# cannot run: a failed start or a death under load, when the failure they recorded is evidence
# about memory (`playbooks.experiments.failures.teaches_about_memory`: an out-of-memory
# signature or the engine's refusal for memory; not a start still loading at the ready timeout,
# a refused argument or another crash). A guardrail or a gate's "not improved" teaches no
# bound: the server ran.
CRASH_CAUSES = frozenset({"died", "failed_start"})
# A step reverted because it broke a latency target (`ttft_p99_s`, `itl_p99_ms`) teaches a bound
# too: a campaign maximises throughput subject to the targets, so going further the same way
# (a larger batch cap, a larger chunk) would break them again.
BOUND_CAUSES = CRASH_CAUSES | {"slo"}

# Risk order of the engines' verdicts: lower goes first between equal gains.
RISK: dict[Verdict, int] = {
    "recommended": 0,
    "possible": 1,
    "needs_opt_in": 2,
    "unsafe": 3,
    "not_useful": 4,
}


# Why a change would change nothing on the server as it runs now, None when it changes
# something (`playbooks.experiments.no_change.unchanged_by`): such a step is passed over.
Unchanged = Callable[[Mapping[str, Any]], str | None]

# Judges changes against the measurement the options came from (`Rules.assess` with the changes
# considered): how a campaign asks the rules about a step it cut down to fit the GPUs' room.


class PolicyError(ValueError):
    """A bounded plan that cannot be read (`--allow` or a stored plan)."""


@dataclass(frozen=True)
class Bound:
    """A value of one argument that did not run on this server, and the side that is refused."""

    key: str
    limit: float
    above: bool  # True: values at or above `limit` are refused; False: at or below
    reason: str
    experiment_id: int | None = None

    def forbids(self, value: Any) -> bool:
        number = _number(value)
        if number is None:
            return False
        return number >= self.limit if self.above else number <= self.limit

    def text(self) -> str:
        side = ">=" if self.above else "<="
        return f"{self.key} {side} {self.limit:g} ({self.reason})"

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "limit": self.limit,
            "above": self.above,
            "reason": self.reason,
            "experiment_id": self.experiment_id,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Bound:
        return cls(
            str(data["key"]),
            float(data["limit"]),
            bool(data["above"]),
            str(data["reason"]),
            data.get("experiment_id"),
        )


@dataclass(frozen=True)
class Range:
    """What a bounded plan allows for one argument: a closed numeric interval, or values."""

    low: float | None = None
    high: float | None = None
    values: frozenset[str] | None = None  # exact spellings, for non-numeric arguments

    def allows(self, value: Any) -> bool:
        if self.values is not None:
            return str(value) in self.values
        number = _number(value)
        if number is None:
            return False
        if self.low is not None and number < self.low:
            return False
        return not (self.high is not None and number > self.high)

    def text(self) -> str:
        if self.values is not None:
            return ",".join(sorted(self.values))
        low = "" if self.low is None else f"{self.low:g}"
        high = "" if self.high is None else f"{self.high:g}"
        return f"{low}..{high}"

    @classmethod
    def parse(cls, text: str) -> Range:
        """`0.85..0.90`, `..0.9`, `64..`, `fp8_e4m3`, `fp8_e4m3,fp8_e5m2`."""
        text = text.strip()
        if not text:
            raise PolicyError("an empty range: give LOW..HIGH (e.g. 0.85..0.90) or values a,b")
        if ".." in text:
            low_text, _, high_text = text.partition("..")
            low, high = _bound_of(low_text, text), _bound_of(high_text, text)
            if low is None and high is None:
                raise PolicyError(f"range {text!r} bounds nothing: give at least one end")
            if low is not None and high is not None and low > high:
                raise PolicyError(f"range {text!r} is empty: its low end is above its high end")
            return cls(low, high)
        values = frozenset(v.strip() for v in text.split(",") if v.strip())
        if not values:
            raise PolicyError(f"range {text!r} names no value")
        return cls(values=values)


@dataclass(frozen=True)
class Allowance:
    """A bounded plan: which arguments, which ranges, how many restarts, when to stop.

    Approved once, it lets a campaign run each of its steps without asking again; each step is
    still gated and recorded. Without ranges, any argument the rules propose is allowed (the
    person approves the steps one by one then).
    """

    ranges: Mapping[str, Range] = field(default_factory=dict)
    max_experiments: int = 3
    stop_at_first_not_kept: bool = True

    def refusal(self, change: Mapping[str, Any]) -> str | None:
        """Why the plan does not cover `change` (None when it does)."""
        if not self.ranges:
            return None
        for key, value in change.items():
            allowed = self.ranges.get(key)
            if allowed is None:
                return f"{key} is not in the plan (it allows {self.keys_text()})"
            if not allowed.allows(value):
                return f"{key}={value} is outside the plan's {key}={allowed.text()}"
        return None

    def keys_text(self) -> str:
        return ", ".join(sorted(self.ranges)) or "any argument"

    def text(self) -> str:
        """What an approval of this plan names, exactly."""
        allowed = " ".join(f"{k}={r.text()}" for k, r in sorted(self.ranges.items()))
        stop = ", stopping at the first change not kept" if self.stop_at_first_not_kept else ""
        return f"at most {self.max_experiments} restart(s), {allowed or 'any argument'}{stop}"

    def to_json(self) -> dict[str, Any]:
        return {
            "ranges": {
                k: {"low": r.low, "high": r.high, "values": sorted(r.values) if r.values else None}
                for k, r in sorted(self.ranges.items())
            },
            "max_experiments": self.max_experiments,
            "stop_at_first_not_kept": self.stop_at_first_not_kept,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Allowance:
        ranges = {
            str(k): Range(
                v.get("low"),
                v.get("high"),
                frozenset(v["values"]) if v.get("values") else None,
            )
            for k, v in dict(data.get("ranges") or {}).items()
        }
        return cls(
            ranges,
            int(data.get("max_experiments", 3)),
            bool(data.get("stop_at_first_not_kept", True)),
        )

    @classmethod
    def parse(
        cls, items: Sequence[str], max_experiments: int, *, stop_at_first_not_kept: bool = True
    ) -> Allowance:
        """`--allow KEY=RANGE` items (the keys are checked against the engine by the caller)."""
        if max_experiments < 1:
            raise PolicyError(
                f"--max-experiments must be at least 1, got {max_experiments}: a campaign "
                "with no restart cannot try anything"
            )
        ranges: dict[str, Range] = {}
        for item in items:
            key, sep, text = item.partition("=")
            key = key.strip()
            if not sep or not key:
                raise PolicyError(
                    f"--allow {item!r}: expected KEY=RANGE, e.g. "
                    "mem_fraction_static=0.85..0.90 or kv_cache_dtype=fp8_e4m3"
                )
            if key in ranges:
                raise PolicyError(f"--allow names {key} twice: give one range per argument")
            ranges[key] = Range.parse(text)
        return cls(ranges, max_experiments, stop_at_first_not_kept)


@dataclass(frozen=True)
class Tried:
    """A step a campaign (or any experiment on the server) already took."""

    change: Mapping[str, Any]
    kept: bool
    cause: str = ""  # the recorded cause (`died`, `not_improved`, ...)


@dataclass(frozen=True)
class Choice:
    """The next step, or why there is none; and what was passed over, with why."""

    option: Option | None
    stop: str = ""
    skipped: tuple[tuple[str, str], ...] = ()


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return {k: str(v) for k, v in a.items()} == {k: str(v) for k, v in b.items()}


def _not_a_step(
    option: Option, tried: Sequence[Tried], force: bool, unchanged: Unchanged | None
) -> str | None:
    """Options no campaign takes: actions off the server, useless, unsafe, already tried, or
    what the server already runs (a restart that changes nothing, even with force)."""
    if not option.change:
        return "it is not a change to the server"
    if unchanged is not None and (same := unchanged(option.change)) is not None:
        return same
    if option.verdict == "not_useful":
        return "the rules expect no gain from it"
    if option.verdict == "unsafe" and not force:
        return "the safety checks call it unsafe"
    if any(_same(option.change, t.change) for t in tried):
        return "already tried on this server"
    return None


def _outside_plan(
    option: Option,
    tried: Sequence[Tried],
    bounds: Sequence[Bound],
    allowance: Allowance | None,
    force: bool,
    room: GpuRoom | None = None,
) -> str | None:
    """Options this server's history or the approved plan rule out, or that need evidence."""
    for bound in bounds:
        if not force and bound.forbids(option.change.get(bound.key)):
            return f"a learned bound forbids it: {bound.text()}"
    if allowance is not None:
        refused = allowance.refusal(option.change)
        if refused is not None:
            return refused
    if option.verdict == "needs_opt_in" and (allowance is None or not allowance.ranges):
        return "it trades something away (needs an explicit opt-in: --allow KEY=VALUE)"
    if option.verdict == "possible" and not force:
        return _unproven(option, tried, room)
    return None


def _unproven(option: Option, tried: Sequence[Tried], room: GpuRoom | None) -> str | None:
    """Why a step past the engine's reserve lacks evidence: a kept step first, and, where the
    GPUs can be read, room for what the change adds under the load the server ran."""
    if not any(t.kept for t in tried):
        return (
            "it spends part of the engine's own reserve: taken only after a kept step has "
            "shown this server runs a changed configuration under load"
        )
    if room is not None and option.static_gpu_gib is not None:
        return room.refusal(option.static_gpu_gib, option.change)
    return None


def choose_next(
    options: Sequence[Option],
    *,
    tried: Sequence[Tried] = (),
    bounds: Sequence[Bound] = (),
    allowance: Allowance | None = None,
    force: bool = False,
    room: GpuRoom | None = None,
    reassess: Reassess | None = None,
    unchanged: Unchanged | None = None,
) -> Choice:
    """The option with the most expected gain per restart (ties: the lower risk), or why none.

    A `possible` step, one past the engine's own margins, comes only when no step within them
    is left: a larger predicted gain does not pay for a crash under load, which costs a restart
    to try and another to recover, and ends a bounded plan.

    `tried` are this server's earlier steps, `bounds` what its crashes taught, `allowance` the
    approved plan (None: each step is asked for), `room` the GPU memory the server left free
    under load where its GPUs can be read (`playbooks.campaigns.room`). Where nothing else is
    left and a step was passed over only because it does not fit that room, `reassess` (the
    rules, asked about other changes against the same measurement) judges it cut down to the
    largest memory fraction that fits (`fitted`); and, under a plan, a step passed over only
    for arguments the plan does not name is judged cut down to those it does (`within_plan`).
    `unchanged` says which changes the server already runs (passed over, even with force).
    Counting restarts and stopping at the first change not kept is the caller's:
    `campaign_stop` below.
    """

    def reason(option: Option) -> str | None:
        """Why a campaign must pass over this option now (None: it may take it)."""
        return _not_a_step(option, tried, force, unchanged) or _outside_plan(
            option, tried, bounds, allowance, force, room
        )

    skipped: list[tuple[str, str]] = []
    candidates: list[Option] = []
    too_large: list[Option] = []
    for option in options:
        why = reason(option)
        if why is None:
            candidates.append(option)
        elif option.change:
            skipped.append((option.title, why))
            if room is not None and why == room.refusal(
                option.static_gpu_gib or 0.0, option.change
            ):
                too_large.append(option)
    cut: list[Option] = []
    if not candidates and too_large and reassess is not None and room is not None:
        cut += fitted(too_large, room, reassess)
    if allowance is not None and reassess is not None:
        cut += within_plan(options, allowance, reassess)
    candidates += [option for option in cut if reason(option) is None]
    if not candidates:
        stop = "nothing useful is left to try" if not skipped else "every option was passed over"
        return Choice(None, stop + _plan_lacks(options, allowance), tuple(skipped))
    best = min(
        candidates,
        key=lambda o: (o.verdict == "possible", -expected_gain(o), RISK[o.verdict]),
    )
    return Choice(best, "", tuple(skipped))


def _plan_lacks(options: Sequence[Option], allowance: Allowance | None) -> str:
    """Where the plan lacks an argument the rules' recommendation needs: which, and how to add
    it ("" when nothing recommended was passed over for that)."""
    if allowance is None or not allowance.ranges:
        return ""
    for option in options:
        missing = [k for k in option.change if k not in allowance.ranges]
        if option.verdict == "recommended" and missing:
            return (
                f"; the rules recommend {option.title}, which needs {', '.join(missing)} in the "
                f"plan: add --allow {missing[0]}=LOW..HIGH"
            )
    return ""


def campaign_stop(tried_in_campaign: Sequence[Tried], allowance: Allowance) -> str | None:
    """Why a campaign ends before looking for another step (None: it may go on)."""
    if len(tried_in_campaign) >= allowance.max_experiments:
        return f"the plan's {allowance.max_experiments} restart(s) are used"
    if allowance.stop_at_first_not_kept and tried_in_campaign and not tried_in_campaign[-1].kept:
        return "the last change was not kept, and the plan stops at the first one not kept"
    return None


def bound_from(
    change: Mapping[str, Any],
    before: Mapping[str, Any],
    cause: str,
    *,
    failure: Failure | None = None,
    reason: str,
    experiment_id: int | None = None,
) -> list[Bound]:
    """What a step that ran out of memory (or broke a latency target, cause `slo`) teaches: for
    each numeric argument it moved, the value that failed and everything further in the same
    direction. A failed start or a death teaches only with memory evidence (`failure`; see
    CRASH_CAUSES). `before` holds the values it moved from (absent: the engine's default, taken
    as below any value set)."""
    if cause not in BOUND_CAUSES:
        return []
    if cause in CRASH_CAUSES and not teaches_about_memory(failure):
        return []
    bounds = []
    for key, value in change.items():
        number = _number(value)
        if number is None:
            continue
        old = _number(before.get(key))
        above = old is None or number > old
        bounds.append(Bound(key, number, above, reason, experiment_id))
    return bounds


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _bound_of(text: str, whole: str) -> float | None:
    text = text.strip()
    if not text:
        return None
    number = _number(text)
    if number is None:
        raise PolicyError(f"range {whole!r}: {text!r} is not a number")
    return number
