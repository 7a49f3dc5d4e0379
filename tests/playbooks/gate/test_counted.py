"""The gate's decode rate from SGLang's decode count, and a trial sized for the predicted gain."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from playbooks.engines.base import Snapshot
from playbooks.gate import GateSettings, decide
from playbooks.gate.counted import counted
from playbooks.gate.settings import sized_for
from playbooks.gate.windows import trial_window


def s(t: float, gauge: float | None, count: float | None) -> Snapshot:
    return Snapshot(t=t, decode_rate=gauge, decoded_tokens=count, running=10, queued=5)


@pytest.mark.parametrize(
    ("samples", "rates"),
    [
        # the count's increase per second replaces each later reading's gauge
        ([s(5, 90, 0), s(10, 130, 500), s(15, 70, 1000)], [90, 100, 100]),
        # a count that went back (a restart between): that reading keeps its gauge
        ([s(5, 90, 4000), s(10, 130, 500), s(15, 70, 1000)], [90, 130, 100]),
        # less than a second between two readings: the gauge
        ([s(5, 90, 0), s(5.5, 130, 60), s(10.5, 70, 560)], [90, 130, 100]),
        # no count (an older SGLang, vLLM): unchanged
        ([s(5, 90, None), s(10, 130, None)], [90, 130]),
        ([s(5, 90, None), s(10, 130, 500), s(15, 70, 1000)], [90, 130, 100]),
        ([s(5, 0, 10), s(10, 0, 10)], [0, 0]),  # idle: nothing decoded
        # samples left out between two readings (a peer out of rotation): the gauge, not the
        # count's rate over the time left out
        ([s(5, 90, 0), s(10, 130, 500), s(40, 70, 9000), s(45, 95, 9500)], [90, 100, 70, 100]),
        ([], []),
    ],
)
def test_the_decode_rate_is_the_count_over_the_interval(
    samples: list[Snapshot], rates: list[float]
) -> None:
    out = counted(samples)
    assert [x.decode_rate for x in out] == pytest.approx(rates)
    assert counted(out) == out  # twice changes nothing


def noisy_window(seconds: float, rate: float, seed: int, start: float = 0.0) -> list[Snapshot]:
    """A steady decode rate whose 5 s gauge swings +-40% (it sees the last few steps only);
    the decode count moves at the true rate."""
    rng = random.Random(seed)
    out, count, t = [], 0.0, start
    while t < start + seconds:
        t += 5.0
        count += rate * 5.0
        gauge = rate * (1 + rng.uniform(-0.4, 0.4))
        snap = Snapshot(
            t=t, decode_rate=gauge, decoded_tokens=count, running=50, queued=100,
            generated_tokens=count, completed_requests=count / 500, prompt_tokens=count,
        )  # fmt: skip
        out.append(snap)
    return out


def test_the_gate_judges_the_count_where_the_gauge_swings() -> None:
    """A +6% gain under a gauge that swings +-40%: counted, the trial's mean is exactly the
    decode count's rate, and the gate keeps it within minutes."""
    settings = GateSettings(baseline_s=600, max_trial_s=900)
    baseline = noisy_window(600, 1000, 1)
    trial = noisy_window(600, 1060, 2)
    tw = trial_window(trial, settings)
    assert tw.mean == pytest.approx(1060)
    decision = decide(baseline, trial, settings)
    assert decision.action == "keep", decision.rule
    gauge_only = [Snapshot(**{**vars(x), "decoded_tokens": None}) for x in trial]
    assert trial_window(gauge_only, settings).mean != pytest.approx(1060, rel=1e-6)


@pytest.mark.parametrize(
    ("predicted", "planning"),
    [
        (None, 0.10),  # nothing predicted: as configured
        ((0.055, 0.12), 0.055),  # sized for the low end
        ((0.035, 0.08), 0.05),  # never below min_effect + 2 points
        ((0.02, 0.08), 0.10),  # a low end not above min_effect: as configured
        ((0.0, 0.0), 0.10),
        ((-0.05, 0.04), 0.10),
        ((0.15, 0.40), 0.10),  # a low end above the configured effect: as configured
        ((0.10, 0.20), 0.10),
    ],
)
def test_a_trial_is_sized_for_the_gain_predicted(
    predicted: tuple[float, float] | None, planning: float
) -> None:
    sized = sized_for(GateSettings(), predicted)
    assert sized.planning_effect == pytest.approx(planning)
    assert sized.min_effect == 0.03 and sized.alpha == 0.05  # the keep rule stays


def test_a_trial_sized_for_a_smaller_gain_does_not_revert_it_as_futile() -> None:
    """+4% read with a 3.5% standard error: the default +10% is ruled out (the upper one-sided
    90% bound is about +8.5%), the +5.5% the rules predicted is not."""
    settings = GateSettings()
    sized = sized_for(settings, (0.055, 0.12))
    d, se = math.log(1.04), 0.035
    assert d < math.log1p(settings.planning_effect) - settings.futility_z * se  # futile at 10%
    assert not d < math.log1p(sized.planning_effect) - sized.futility_z * se  # not at 5.5%


def test_a_restart_is_told_from_a_bad_reading_by_the_other_counters() -> None:
    """The count going back with the requests' counters is a new process; alone, a bad one."""
    base = [Snapshot(t=5.0 * i, decode_rate=90.0, decoded_tokens=500.0 * i,
                     completed_requests=10.0 * i) for i in range(1, 4)]  # fmt: skip
    restart = Snapshot(t=20.0, decode_rate=80.0, decoded_tokens=100.0, completed_requests=1.0)
    after = Snapshot(t=25.0, decode_rate=70.0, decoded_tokens=600.0, completed_requests=3.0)
    rates = [x.decode_rate for x in counted([*base, restart, after])]
    assert rates == pytest.approx([90, 100, 100, 80, 100])  # measured from the restart
    # a count low in one reading only (a rank's series missing): not used, and the next
    # reading is measured from the last good one
    glitch = replace(restart, completed_requests=35.0)
    later = replace(after, decoded_tokens=2000.0, completed_requests=40.0)
    rates = [x.decode_rate for x in counted([*base, glitch, later])]
    assert rates == pytest.approx([90, 100, 100, 80, 50])  # (2000 - 1500) / 10 s


def test_a_gauge_baseline_is_not_compared_with_a_counted_trial() -> None:
    """Stored before the count was read (or from a source without it): both windows are read
    off the gauge, not one of each."""
    from playbooks.gate.look import read_look  # noqa: PLC0415

    settings = GateSettings(baseline_s=600, max_trial_s=900)
    baseline = [replace(x, decoded_tokens=None) for x in noisy_window(600, 1000, 1)]
    trial = noisy_window(600, 1060, 2)
    look = read_look(baseline, trial, settings)
    gauge_trial = [replace(x, decoded_tokens=None) for x in trial]
    assert look.trial_mean == read_look(baseline, gauge_trial, settings).trial_mean
    assert look.trial_mean != pytest.approx(1060, rel=1e-6)
