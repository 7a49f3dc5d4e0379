"""Latency targets: the p99 guardrail with its interval, table by table, then through `decide`."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from playbooks.engines.base import Snapshot
from playbooks.experiments.advance import settings_of
from playbooks.gate import GateSettings, decide, slo_holds
from playbooks.gate.latency import (
    SloCheck,
    Target,
    Verdict,
    configured,
    judge,
    targets_of,
    window_latency,
    window_slo_holds,
)
from playbooks.stats.intervals import Interval
from tests.playbooks.gate.test_gate import BASE, SETTINGS, Window, run_gate, window

ITL = Target("itl", 0.020)  # itl_p99_ms = 20
TTFT = Target("ttft", 2.0)


# --------------------------------------------------------------------------- the verdict


@pytest.mark.parametrize(
    ("name", "trial", "baseline", "verdict"),
    [
        ("clearly above, baseline within", [0.030, 0.031, 0.029], [0.015] * 4, "broken"),
        ("clearly above, no baseline reading", [0.030, 0.031, 0.029], [], "broken"),
        ("within", [0.015, 0.016, 0.014], [0.015] * 4, "held"),
        # the mean is above the target, but the interval reaches below it: not shown broken
        ("straddling the target", [0.012, 0.030, 0.026], [0.015] * 4, "held"),
        ("too few batches yet", [0.050, 0.050], [0.015] * 4, "unmeasured"),
        # a baseline already above the target: only a clearly worse trial is the change's doing
        ("already above, as bad", [0.030, 0.031, 0.029], [0.031, 0.029, 0.030], "already_broken"),
        ("already above, clearly worse", [0.060, 0.061, 0.059], [0.031, 0.029, 0.030], "broken"),
        ("already above, now within", [0.015, 0.016, 0.014], [0.031, 0.029, 0.030], "held"),
    ],
)
def test_judge(name: str, trial: list[float], baseline: list[float], verdict: Verdict) -> None:
    check = judge(ITL, trial=trial, baseline=baseline, is_exported=True, confidence=0.95)
    assert check.verdict == verdict, (name, check.text)


def test_a_target_the_server_does_not_export_is_not_judged() -> None:
    check = judge(ITL, trial=[0.05] * 5, baseline=[], is_exported=False, confidence=0.95)
    assert check.verdict == "not_exported"
    assert check.text == (
        "ITL p99 target (20.0 ms) not judged: the server exports no inter-token latency histogram"
    )


@pytest.mark.parametrize(
    ("trial", "baseline", "text"),
    [
        (
            [0.030, 0.031, 0.029],
            [0.015] * 4,
            "ITL p99 broke its 20.0 ms target: trial 30.0 ms (95% interval 27.5 ms … 32.5 ms, "
            "3 batches), the whole interval above it; "
            "baseline 15.0 ms (95% interval 15.0 ms … 15.0 ms, 4 batches)",
        ),
        (
            [0.030, 0.031, 0.029],
            [0.031, 0.029, 0.030],
            "ITL p99 was already above its 20.0 ms target before the change; baseline 30.0 ms "
            "(95% interval 27.5 ms … 32.5 ms, 3 batches); the trial's 30.0 ms (95% interval "
            "27.5 ms … 32.5 ms, 3 batches) is not clearly worse",
        ),
        (
            [0.050, 0.050],
            [],
            "ITL p99 target (20.0 ms) not judged yet: 2 of 3 trial batches observed any",
        ),
    ],
)
def test_the_reason_gives_the_numbers_and_the_interval(
    trial: list[float], baseline: list[float], text: str
) -> None:
    check = judge(ITL, trial=trial, baseline=baseline, is_exported=True, confidence=0.95)
    assert check.text == text


def check(verdict: Verdict) -> SloCheck:
    iv = Interval(0.02, 0.01, 0.03, 3, 0.005)
    return SloCheck(ITL, verdict, iv if verdict not in ("unmeasured", "not_exported") else None,
                    None, 0.95)  # fmt: skip


@pytest.mark.parametrize(
    ("verdicts", "holds"),
    [
        ((), True),  # no target configured: nothing to break
        (("held",), True),
        (("held", "held"), True),
        (("held", "broken"), False),
        (("already_broken",), False),  # above the target, whoever broke it
        (("held", "unmeasured"), None),
        (("not_exported", "broken"), False),
        (("not_exported",), None),
    ],
)
def test_slo_holds(verdicts: tuple[Verdict, ...], holds: bool | None) -> None:
    assert slo_holds(check(v) for v in verdicts) is holds


# --------------------------------------------------------------------------- a window (diagnose)

BOUNDS = (0.01, 0.02, 0.03, 0.04, 0.06, math.inf)


def cumulative(counts: dict[float, float]) -> tuple[tuple[float, float], ...]:
    """Cumulative buckets from counts per bucket."""
    total, out = 0.0, []
    for le in BOUNDS:
        total += counts.get(le, 0.0)
        out.append((le, total))
    return tuple(out)


@pytest.mark.parametrize(
    ("limit_ms", "first", "last", "p99_ms", "verdict"),
    [
        (20.0, {0.01: 500.0}, {0.01: 500.0, 0.02: 1000.0}, 19.9, "held"),
        (15.0, {0.01: 500.0}, {0.01: 500.0, 0.02: 1000.0}, 19.9, "broken"),
        (None, {0.01: 500.0}, {0.01: 500.0, 0.02: 1000.0}, 19.9, None),  # reported only
        (20.0, {0.01: 500.0}, {0.01: 500.0}, None, "unmeasured"),  # nothing in the window
    ],
)
def test_window_p99_is_read_off_the_increase(
    limit_ms: float | None,
    first: dict[float, float],
    last: dict[float, float],
    p99_ms: float | None,
    verdict: Verdict | None,
) -> None:
    _, itl = targets_of(None, limit_ms)
    a = Snapshot(itl_buckets=cumulative(first))
    b = Snapshot(itl_buckets=cumulative(last))
    reading = window_latency(a, b, itl)
    assert reading.p99_s == (None if p99_ms is None else pytest.approx(p99_ms / 1000))
    assert reading.verdict == verdict
    assert reading.to_json()["p99"] == p99_ms


def test_a_window_without_the_histogram_says_so() -> None:
    ttft, itl = targets_of(2.0, 20.0)
    a, b = Snapshot(), Snapshot()
    readings = [window_latency(a, b, ttft), window_latency(a, b, itl)]
    assert [r.verdict for r in readings] == ["not_exported", "not_exported"]
    assert window_slo_holds(readings) is None
    assert window_slo_holds([]) is True


# --------------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ttft_p99_s": 0.0}, "ttft_p99_s must be a positive number of s"),
        ({"itl_p99_ms": -1.0}, "itl_p99_ms must be a positive number of ms"),
        ({"itl_p99_ms": math.nan}, "itl_p99_ms"),
        ({"ttft_p99_s": math.inf}, "ttft_p99_s"),
    ],
)
def test_targets_are_validated(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GateSettings(**kwargs)  # type: ignore[arg-type]


def test_a_plan_stored_before_the_targets_existed_still_loads() -> None:
    stored = {
        k: v for k, v in vars(GateSettings()).items() if k not in ("ttft_p99_s", "itl_p99_ms")
    }
    settings = settings_of(SimpleNamespace(settings=stored))  # type: ignore[arg-type]
    assert (settings.ttft_p99_s, settings.itl_p99_ms) == (None, None)
    assert configured(settings) == ()
    with_targets = settings_of(SimpleNamespace(settings={**stored, "itl_p99_ms": 20.0}))  # type: ignore[arg-type]
    assert configured(with_targets) == (ITL,)


# --------------------------------------------------------------------------- through the gate

Latency = Callable[[float], float | None]  # seconds after the window's start -> ITL, or nothing


def with_itl(samples: list[Snapshot], latency: Latency, seed: int) -> list[Snapshot]:
    """The samples with a cumulative ITL histogram: each scrape adds 100 observations in the
    bucket of the window's latency then, and a few in the bucket below (so that batches differ
    a little), or none."""
    rng = random.Random(seed)
    counts: dict[float, float] = {}
    out = []
    for s in samples:
        at = latency(s.t)
        if at is not None:
            i = next(i for i, b in enumerate(BOUNDS) if at <= b)
            counts[BOUNDS[i]] = counts.get(BOUNDS[i], 0.0) + 100.0
            below = BOUNDS[max(0, i - 1)]
            counts[below] = counts.get(below, 0.0) + rng.choice((0.0, 1.0, 2.0))
        out.append(replace(s, itl_buckets=cumulative(counts)))
    return out


def steady(seconds: float) -> Latency:
    return lambda t: seconds


GAIN = Window(rate=1150.0)
TARGETED = replace(SETTINGS, itl_p99_ms=20.0)


def gate(
    trial_itl: Latency | None, base_itl: Latency | None, settings: GateSettings = TARGETED
) -> Any:
    baseline = window(BASE, 11)
    trial = window(GAIN, 12)
    if base_itl is not None:
        baseline = with_itl(baseline, base_itl, 1)
    if trial_itl is not None:
        trial = with_itl(trial, trial_itl, 2)
    return run_gate(trial, baseline, settings)


@pytest.mark.parametrize(
    ("name", "trial_itl", "base_itl", "action", "verdict", "rule", "held"),
    [
        (
            "a faster server that breaks its ITL target is reverted",
            steady(0.035), steady(0.008), "revert", "guardrail", "ITL p99 broke its 20.0 ms target",
            False,
        ),
        (
            "a faster server within its target is kept",
            steady(0.008), steady(0.008), "keep", "improved", "the decode rate rose", True,
        ),
        (
            "a target already broken before the change is not blamed on it",
            steady(0.035), steady(0.035), "keep", "improved", "the decode rate rose", False,
        ),
        (
            "but a change that makes it clearly worse is reverted",
            steady(0.055), steady(0.025), "revert", "guardrail", "ITL p99 was already above",
            False,
        ),
        (
            "a server without the histogram is judged on throughput",
            None, None, "keep", "improved", "the decode rate rose", None,
        ),
    ],
)  # fmt: skip
def test_decisions_with_an_itl_target(
    name: str,
    trial_itl: Latency | None,
    base_itl: Latency | None,
    action: str,
    verdict: str,
    rule: str,
    held: bool | None,
) -> None:
    decision, _ = gate(trial_itl, base_itl)
    assert (decision.action, decision.verdict) == (action, verdict), (name, decision.rule)
    assert decision.rule.startswith(rule), (name, decision.rule)
    assert decision.slo_held is held, (name, decision.latency)
    assert any(r.startswith("ITL p99") for r in decision.reasons), decision.reasons


def test_a_keep_waits_until_the_target_is_measured() -> None:
    # the trial observes no inter-token latency before 400 s (say, its first answers are long)
    late = lambda t: None if t < 400.0 else 0.008  # noqa: E731
    decision, when = gate(late, steady(0.008))
    assert decision.action == "keep" and decision.slo_held is True
    assert when >= 400.0 + 3 * TARGETED.batch_s - TARGETED.batch_s
    baseline = with_itl(window(BASE, 11), steady(0.008), 1)
    early = decide(
        baseline, [s for s in with_itl(window(GAIN, 12), late, 2) if s.t <= 300], TARGETED
    )
    assert early.action == "continue" and "waiting to judge the latency targets" in early.rule


def test_without_targets_nothing_changes() -> None:
    plain, _ = gate(steady(0.035), steady(0.008), SETTINGS)
    assert plain.action == "keep" and plain.latency == () and plain.slo_held is True
