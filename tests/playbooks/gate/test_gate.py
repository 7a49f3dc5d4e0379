"""The improve-or-revert gate on synthetic scrape series (deterministic random)."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, replace

import pytest

from bench.fixed_window import fixed_window_test, plan_trial
from playbooks.engines.base import Snapshot
from playbooks.gate import (
    GateDecision,
    GateSettings,
    baseline_noise,
    batch_means,
    decide,
    mser_truncation,
    overlapping_window_variance,
    scraped_batches,
    warmup_cut,
)

SAMPLE_S = 5.0


@dataclass(frozen=True)
class Window:
    """How a synthetic window behaves."""

    rate: float = 1000.0  # decode tokens/s in steady state
    seconds: float = 900.0
    cv: float = 0.05  # stationary noise of the 5 s gauge
    rho: float = 0.8  # AR(1) correlation between 5 s scrapes
    swing: float = 0.0  # amplitude of a retraction-cycle-like oscillation, relative
    period_s: float = 210.0
    phase: float = 0.0
    ramp_s: float = 0.0  # linear ramp from 20% of `rate` after a restart
    running: float = 50.0
    queued: float = 100.0
    queue_share: float = 1.0  # share of scrapes with a non-empty queue
    prompt_per_req: float = 400.0
    output_per_req: float = 500.0
    first_wave_s: float = 0.0  # completions before this many seconds have half the output
    error_share: float = 0.0  # errors per completed request
    retractions_per_min: float = 1.0
    ttft_p95_s: float | None = 2.0
    with_optional: bool = True


def window(w: Window, seed: int) -> list[Snapshot]:
    rng = random.Random(seed)
    innov = w.cv * math.sqrt(1 - w.rho**2)
    noise = rng.gauss(0, w.cv)
    gen = prompt = reqs = errs = rets = 0.0
    out: list[Snapshot] = []
    t = 0.0
    while t < w.seconds:
        t += SAMPLE_S
        noise = w.rho * noise + rng.gauss(0, innov)
        level = w.rate * (1 + w.swing * math.sin(2 * math.pi * t / w.period_s + w.phase))
        if t < w.ramp_s:
            level *= 0.2 + 0.8 * t / w.ramp_s
        g = max(0.0, level * (1 + noise))
        per_req = w.output_per_req / (2 if t < w.first_wave_s else 1)
        done = g * SAMPLE_S / per_req
        gen += g * SAMPLE_S
        reqs += done
        prompt += done * w.prompt_per_req
        errs += done * w.error_share
        rets += w.retractions_per_min * SAMPLE_S / 60
        queued = w.queued if rng.random() < w.queue_share else 0.0
        out.append(
            Snapshot(
                t=t,
                decode_rate=g,
                generated_tokens=gen,
                prompt_tokens=prompt,
                completed_requests=reqs,
                running=w.running,
                queued=queued,
                ttft_p95_s=w.ttft_p95_s if w.with_optional else None,
                aborted_requests=errs if w.with_optional else None,
                preemptions=rets if w.with_optional else None,
            )
        )
    return out


SETTINGS = GateSettings(max_trial_s=900.0)
BASE = Window(seconds=900.0)


def run_gate(
    trial: list[Snapshot], baseline: list[Snapshot], settings: GateSettings = SETTINGS
) -> tuple[GateDecision, float]:
    """Look after every new batch of trial, as the bot would; return the decision and its time."""
    look = settings.batch_s
    while True:
        body = [s for s in trial if s.t <= look]
        decision = decide(baseline, body, settings)
        if decision.action != "continue" or look >= trial[-1].t:
            return decision, look
        look += settings.batch_s


# --------------------------------------------------------------------------- building blocks


def test_mser_cuts_a_ramp_and_nothing_from_a_flat_series() -> None:
    rng = random.Random(1)
    flat = [100 + rng.gauss(0, 2) for _ in range(200)]
    ramp = [20 + 80 * i / 40 for i in range(40)] + flat[:160]
    assert mser_truncation(flat) <= 10
    cut = mser_truncation(ramp)
    assert 30 <= cut <= 60
    # never more than half
    assert mser_truncation([float(i) for i in range(100)]) <= 50


def test_batch_means() -> None:
    samples = window(Window(seconds=600, cv=0.0), 1)
    means = batch_means(samples, 0.0, 30.0, lambda s: s.decode_rate)
    assert len(means) == 20 and all(m == pytest.approx(1000.0) for m in means)


@pytest.mark.parametrize(
    ("times", "rate", "batches"),
    [
        ([10.0 * i for i in range(1, 37)], 1000.0, 6),  # a scrape every 10 s for 360 s
        ([10.0 * i for i in range(1, 37) if not 100 < 10 * i <= 250], 1000.0, 4),  # a stall
        ([10.0 * i for i in range(1, 37)], None, 6),  # idle: scraped, with no decode rate
        ([10.0], 1000.0, 0),
    ],
)
def test_scraped_batches_count_batches_holding_a_scrape(
    times: list[float], rate: float | None, batches: int
) -> None:
    samples = [Snapshot(t=t, decode_rate=rate) for t in times]
    assert scraped_batches(samples, 60.0) == batches


def test_window_variance_of_independent_values_falls_as_one_over_length() -> None:
    rng = random.Random(2)
    values = [100 * (1 + rng.gauss(0, 0.1)) for _ in range(4000)]
    for m in (1, 4, 16):
        assert overlapping_window_variance(values, m) == pytest.approx(0.01 / m, rel=0.2)
    with pytest.raises(ValueError):
        overlapping_window_variance(values, 0)
    with pytest.raises(ValueError):
        overlapping_window_variance(values[:3], 3)


def test_window_variance_sees_through_an_oscillation() -> None:
    """A whole period averages the swing away; half a period keeps most of it."""
    period = 40
    values = [100 * (1 + 0.2 * math.sin(2 * math.pi * i / period)) for i in range(8 * period)]
    whole = overlapping_window_variance(values, period)
    half = overlapping_window_variance(values, period // 2)
    assert whole < 1e-4 < half
    # what independent batches would claim for the same window: far from either
    per_value = statistics.pvariance(values) / statistics.fmean(values) ** 2
    assert per_value / period > 10 * whole


def test_baseline_noise_envelope_scaling_and_pooling() -> None:
    samples = window(Window(seconds=1200, swing=0.15, cv=0.03), 3)
    noise = baseline_noise(samples, 30.0)
    assert noise.bin_s == 5.0 and noise.direct_bins == 60  # a quarter of 240 scrapes
    lengths = [30.0 * k for k in range(1, 40)]
    variances = [noise.relative_variance(x) for x in lengths]
    assert variances == sorted(variances, reverse=True)  # a shorter window is never calmer
    assert noise.relative_variance(600.0) == pytest.approx(noise.relative_variance(300.0) / 2)
    assert noise.mean_variance == pytest.approx(noise.relative_variance(noise.seconds))
    calm = [1000.0 + (i % 2) for i in range(240)]
    pooled = noise.pooled(calm, 0.25)
    assert pooled.relative_variance(60.0) < noise.relative_variance(60.0)
    assert noise.pooled(calm[:3], 0.25) is noise  # too short to say anything


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_effect": -0.1}, "min_effect"),
        ({"alpha": 1.5}, "alpha"),
        ({"beta": 0.6}, "beta"),
        ({"planning_effect": 0.02}, "planning_effect"),
        ({"restart_variance_factor": 0.5}, "restart_variance_factor"),
        ({"max_trial_s": 100.0}, "max_trial_s"),
        ({"warmup_max_fraction": 0.9}, "warmup_max_fraction"),
        ({"ttft_p95_factor": 0.5}, "ttft_p95_factor"),
    ],
)
def test_settings_are_validated(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GateSettings(**kwargs)  # type: ignore[arg-type]


def test_plan_trial_reads_the_horizon_off_the_baseline() -> None:
    settings = GateSettings()
    calm = plan_trial(window(Window(seconds=1200, cv=0.03), 4), settings)
    rough = plan_trial(window(Window(seconds=1200, cv=0.15, swing=0.2), 4), settings)
    assert calm.fixed_horizon_s is not None and not calm.notes
    assert calm.earliest_s == settings.warmup_floor_s + settings.min_batches * settings.batch_s
    assert calm.earliest_s <= calm.fixed_horizon_s <= settings.max_trial_s
    assert rough.standard_error_at_cap > calm.standard_error_at_cap
    assert rough.detectable_at_cap > calm.detectable_at_cap
    assert rough.fixed_horizon_s is None or rough.fixed_horizon_s > calm.fixed_horizon_s
    short = plan_trial(window(Window(seconds=300, cv=0.3, swing=0.3), 5), settings)
    assert short.notes and "longer baseline" in short.notes[0]
    with pytest.raises(ValueError, match="batches"):
        plan_trial(window(Window(seconds=60), 6), settings)


# --------------------------------------------------------------------------- decisions


@pytest.mark.parametrize(
    ("name", "trial", "action", "verdicts", "max_time"),
    [
        ("clear improvement", Window(rate=1150.0), "keep", {"improved"}, 450.0),
        ("harmful change", Window(rate=850.0), "revert", {"not_improved"}, 300.0),
        ("no effect", Window(rate=1000.0), "revert", {"not_improved"}, 450.0),
        (
            "load drift: fewer clients",
            Window(rate=1150.0, running=40.0, queued=30.0),
            "revert",
            {"drifted"},
            150.0,
        ),
        (
            "mix drift: shorter outputs",
            Window(rate=1150.0, output_per_req=300.0),
            "revert",
            {"drifted"},
            450.0,
        ),
        (
            # the change made room for the requests that waited: the queue is gone and the
            # trial is faster, so the gain is shown (a lower bound), not an invalid trial
            "queue cleared by a faster trial",
            Window(rate=1150.0, running=145.0, queued=25.0, queue_share=0.2),
            "keep",
            {"improved"},
            450.0,
        ),
        (
            # the queue emptied while the rate fell: the offered load changed
            "queue cleared while slower",
            Window(rate=850.0, running=145.0, queued=25.0, queue_share=0.2),
            "revert",
            {"inconclusive"},
            150.0,
        ),
        (
            "unsaturated baseline",
            Window(rate=1150.0),
            "revert",
            {"inconclusive"},
            150.0,
        ),
        ("error guardrail", Window(rate=1150.0, error_share=0.05), "revert", {"guardrail"}, 150.0),
        (
            "retraction guardrail",
            Window(rate=1150.0, retractions_per_min=30.0),
            "revert",
            {"guardrail"},
            450.0,
        ),
        ("TTFT guardrail", Window(rate=1150.0, ttft_p95_s=5.0), "revert", {"guardrail"}, 150.0),
        (
            "guardrails absent: fields not exported",
            Window(rate=1150.0, with_optional=False, error_share=0.5),
            "keep",
            {"improved"},
            450.0,
        ),
    ],
)
def test_decisions(
    name: str, trial: Window, action: str, verdicts: set[str], max_time: float
) -> None:
    base_w = BASE if trial.with_optional else replace(BASE, with_optional=False)
    if name == "unsaturated baseline":
        base_w = replace(base_w, running=145.0, queued=25.0, queue_share=0.2)
    baseline = window(base_w, 11)
    decision, when = run_gate(window(trial, 12), baseline)
    assert decision.action == action, (name, decision.rule, decision.reasons)
    assert decision.verdict in verdicts, (name, decision.verdict, decision.rule)
    assert when <= max_time, (name, when)
    assert decision.rule and decision.reasons
    assert decision.baseline is not None and decision.baseline.mean == pytest.approx(1000, rel=0.05)


def test_clear_improvement_explains_itself() -> None:
    decision, when = run_gate(window(Window(rate=1150.0), 3), window(BASE, 4))
    assert decision.action == "keep"
    assert decision.effect is not None and decision.trial is not None
    assert decision.baseline is not None
    assert decision.effect.low > 0 and decision.effect.low < 0.15 < decision.effect.high
    assert decision.effect.mean == pytest.approx(0.15, abs=0.05)
    assert decision.baseline.low < decision.baseline.mean < decision.baseline.high
    assert decision.trial.low < decision.trial.mean < decision.trial.high
    assert decision.batches >= SETTINGS.min_batches and decision.warmup_cut_s >= 60.0
    assert "3%" in decision.rule and "95% interval" in decision.rule
    assert f"{when / 60:.1f} min after the restart" in decision.rule
    assert any("standard error" in r for r in decision.reasons)


def test_a_keep_waits_for_completed_requests_after_a_cold_start() -> None:
    """The first wave's short requests finish first: their mix is not compared until later."""
    busy = replace(BASE, running=400.0)  # 400 running, 2 completions/s: a 200 s lifetime
    baseline = window(busy, 21)
    trial = window(replace(busy, rate=1300.0, first_wave_s=180.0), 22)
    decision, when = run_gate(trial, baseline)
    assert decision.action == "keep", decision.rule
    assert when >= 200.0 + SETTINGS.min_batches * SETTINGS.batch_s
    early = decide(baseline, [s for s in trial if s.t <= 180.0], SETTINGS)
    assert early.action == "continue" and "waiting for 30 requests" in early.rule, early.rule


def test_small_gain_below_min_effect_is_not_kept() -> None:
    keeps = 0
    for seed in range(20):
        decision, _ = run_gate(window(Window(rate=1010.0), 500 + seed), window(BASE, seed))
        keeps += decision.action == "keep"
    assert keeps <= 1


def test_oscillating_server_no_effect_is_not_kept_and_a_gain_is() -> None:
    """A retraction-cycle swing much larger than the effect: the noise model must see it."""
    base_w = Window(seconds=1200, swing=0.15, cv=0.03, rho=0.5)
    keeps_null = keeps_gain = 0
    for seed in range(12):
        baseline = window(replace(base_w, phase=seed), 300 + seed)
        null = window(replace(base_w, phase=2 * seed + 1, seconds=900), 400 + seed)
        gain = window(replace(base_w, rate=1200.0, phase=2 * seed + 1, seconds=900), 500 + seed)
        keeps_null += run_gate(null, baseline)[0].action == "keep"
        keeps_gain += run_gate(gain, baseline)[0].action == "keep"
    assert keeps_null == 0
    assert keeps_gain >= 10


def test_warmup_ramp_is_excluded() -> None:
    ramped = window(Window(rate=1000.0, ramp_s=240.0, seconds=900.0), 5)
    cut = warmup_cut(ramped, SETTINGS)
    assert 150.0 <= cut <= 450.0
    decision, _ = run_gate(ramped, window(BASE, 6))
    assert decision.warmup_cut_s >= 150.0
    # without the cut the ramp would look like a large loss; with it the gate does not call harm
    assert decision.effect is None or decision.effect.mean > -0.05


def test_cap_leads_to_revert() -> None:
    # a 5% gain with noisy batches cannot be settled within a short cap
    settings = replace(SETTINGS, max_trial_s=300.0)
    decision, when = run_gate(
        window(Window(rate=1050.0, cv=0.3, seconds=300.0), 8),
        window(replace(BASE, cv=0.3), 9),
        settings,
    )
    assert decision.action == "revert"
    assert decision.verdict == "inconclusive"
    assert "cap" in decision.rule
    assert when == pytest.approx(300.0)


def test_waits_for_the_warmup_and_min_batches() -> None:
    baseline = window(BASE, 1)
    trial = window(Window(rate=1200.0), 2)
    early = decide(baseline, [s for s in trial if s.t <= 90.0], SETTINGS)
    assert early.action == "continue" and early.verdict == "pending"
    assert early.trial is None
    with pytest.raises(ValueError):
        decide(baseline[:1], trial, SETTINGS)
    with pytest.raises(ValueError, match="batches"):
        decide(baseline[:10], trial, SETTINGS)
    flat = [replace(s, decode_rate=0.0) for s in baseline]
    with pytest.raises(ValueError, match="zero"):
        decide(flat, trial, SETTINGS)


def test_fixed_window_test_matches_the_gate_on_clear_cases() -> None:
    baseline = window(BASE, 31)
    gain = window(Window(rate=1150.0), 32)
    none = window(Window(rate=1000.0), 33)
    assert fixed_window_test(baseline, gain, SETTINGS, 600.0).action == "keep"
    assert fixed_window_test(baseline, none, SETTINGS, 600.0).action == "revert"
    drift = window(Window(rate=1150.0, running=40.0, queued=30.0), 34)
    assert fixed_window_test(baseline, drift, SETTINGS, 600.0).verdict == "drifted"
    short = fixed_window_test(baseline, gain, SETTINGS, 90.0)
    assert short.action == "revert"  # no complete batch after the warm-up yet


def test_null_effect_false_keep_rate() -> None:
    """200 experiments with no true effect: the gate keeps at most 2% of them."""
    settings = replace(SETTINGS, max_trial_s=600.0)
    base_w = replace(BASE, seconds=600.0, with_optional=False)
    keeps = 0
    for seed in range(200):
        decision, _ = run_gate(window(base_w, 10_000 + seed), window(base_w, seed), settings)
        keeps += decision.action == "keep"
    assert keeps / 200 <= 0.02


def test_a_gap_in_the_trial_counts_for_nothing() -> None:
    """kvpilot was down for three minutes of the trial (killed, then resumed): the batches it
    did not see are not measured time, so the verdict counts only the batches it read and says
    how long it went unread."""
    baseline = window(BASE, 31)
    whole = [s for s in window(Window(rate=1150.0, seconds=600.0), 32) if s.t <= 420.0]
    gap = [s for s in whole if not 150.0 < s.t <= 330.0]
    seen = decide(baseline, gap, SETTINGS)
    unbroken = decide(baseline, whole, SETTINGS)
    assert unbroken.batches - seen.batches == 6  # 180 s unread: six 30 s batches
    assert seen.batches == scraped_batches([s for s in gap if s.t > 60.0], 30.0)
    assert "3.0 min unread" in seen.rule, seen.rule
    assert "unread" not in unbroken.rule
    # the trial's interval is as wide as what was read, not as the time that passed
    assert seen.trial is not None and unbroken.trial is not None
    assert seen.trial.high - seen.trial.low > unbroken.trial.high - unbroken.trial.low
