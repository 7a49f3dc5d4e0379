"""The improve-or-revert gate on synthetic scrape series (deterministic random)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

import pytest

from playbooks.gate import (
    GateDecision,
    GateSample,
    GateSettings,
    batch_means,
    cs_margin,
    decide,
    decorrelate,
    mixture_precision,
    mser_truncation,
    plan_trial,
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
    ramp_s: float = 0.0  # linear ramp from 20% of `rate` after a restart
    running: float = 50.0
    queued: float = 100.0
    queue_share: float = 1.0  # share of scrapes with a non-empty queue
    prompt_per_req: float = 400.0
    output_per_req: float = 500.0
    error_share: float = 0.0  # errors per completed request
    retractions_per_min: float = 1.0
    ttft_p95_s: float | None = 2.0
    with_optional: bool = True


def window(w: Window, seed: int) -> list[GateSample]:
    rng = random.Random(seed)
    innov = w.cv * math.sqrt(1 - w.rho**2)
    noise = rng.gauss(0, w.cv)
    gen = prompt = reqs = errs = rets = 0.0
    out: list[GateSample] = []
    t = 0.0
    while t < w.seconds:
        t += SAMPLE_S
        noise = w.rho * noise + rng.gauss(0, innov)
        level = w.rate
        if t < w.ramp_s:
            level *= 0.2 + 0.8 * t / w.ramp_s
        g = max(0.0, level * (1 + noise))
        done = g * SAMPLE_S / w.output_per_req
        gen += g * SAMPLE_S
        reqs += done
        prompt += done * w.prompt_per_req
        errs += done * w.error_share
        rets += w.retractions_per_min * SAMPLE_S / 60
        queued = w.queued if rng.random() < w.queue_share else 0.0
        out.append(
            GateSample(
                t=t,
                gen_throughput=g,
                generation_tokens_total=gen,
                prompt_tokens_total=prompt,
                num_requests_total=reqs,
                running=w.running,
                queued=queued,
                ttft_p95_s=w.ttft_p95_s if w.with_optional else None,
                errors_total=errs if w.with_optional else None,
                retractions_total=rets if w.with_optional else None,
            )
        )
    return out


SETTINGS = GateSettings(max_trial_s=900.0)
BASE = Window(seconds=900.0)


def run_gate(
    trial: list[GateSample], baseline: list[GateSample], settings: GateSettings = SETTINGS
) -> tuple[GateDecision, float]:
    """Look after every new 30 s of trial, as the bot would; return the decision and its time."""
    look = 30.0
    while True:
        body = [s for s in trial if s.t <= look]
        decision = decide(baseline, body, settings)
        if decision.action != "continue" or look >= trial[-1].t:
            return decision, look
        look += 30.0


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


def test_batch_means_and_decorrelation() -> None:
    samples = window(Window(seconds=600, cv=0.0), 1)
    means = batch_means(samples, 0.0, 30.0, lambda s: s.gen_throughput)
    assert len(means) == 20 and all(m == pytest.approx(1000.0) for m in means)
    trend = [float(i) for i in range(32)]
    merged, batch_s = decorrelate(trend, 30.0, 0.3, 4)
    assert batch_s > 30.0 and len(merged) < 32


def test_confidence_sequence_margin_shrinks_and_is_wider_than_fixed() -> None:
    r = mixture_precision(400.0, 0.025)
    margins = [cs_margin(i, 0.025, r) for i in (50.0, 200.0, 800.0, 3200.0)]
    assert margins == sorted(margins, reverse=True)
    assert cs_margin(400.0, 0.025, r) > 1.96 / math.sqrt(400.0)
    assert cs_margin(0.0, 0.025, r) == math.inf


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_effect": -0.1}, "min_effect"),
        ({"alpha": 1.5}, "alpha"),
        ({"planning_effect": 0.02}, "planning_effect"),
        ({"max_trial_s": 100.0}, "max_trial_s"),
        ({"warmup_max_fraction": 0.9}, "warmup_max_fraction"),
        ({"ttft_p95_factor": 0.5}, "ttft_p95_factor"),
    ],
)
def test_settings_are_validated(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GateSettings(**kwargs)  # type: ignore[arg-type]


def test_plan_trial_sizes_from_the_cv() -> None:
    calm = plan_trial(0.05, GateSettings(), baseline_batches=30)
    noisy = plan_trial(0.12, GateSettings(), baseline_batches=30)
    assert calm.expected_batches < noisy.expected_batches
    assert calm.expected_batches <= calm.fixed_batches
    assert noisy.expected_batches < noisy.fixed_batches / 2
    assert calm.expected_s <= calm.cap_s and not calm.notes
    hopeless = plan_trial(0.5, GateSettings(), baseline_batches=5)
    assert hopeless.notes and hopeless.expected_batches == hopeless.cap_batches
    with pytest.raises(ValueError):
        plan_trial(0.0)


# --------------------------------------------------------------------------- decisions


@pytest.mark.parametrize(
    ("name", "trial", "action", "verdicts", "max_time"),
    [
        ("clear improvement", Window(rate=1150.0), "keep", {"improved"}, 450.0),
        ("harmful change", Window(rate=850.0), "revert", {"not_improved"}, 450.0),
        ("no effect", Window(rate=1000.0), "revert", {"not_improved", "inconclusive"}, 900.0),
        (
            "load drift: fewer clients",
            Window(rate=1150.0, running=40.0, queued=30.0),
            "revert",
            {"drifted"},
            450.0,
        ),
        (
            "mix drift: shorter outputs",
            Window(rate=1150.0, output_per_req=300.0),
            "revert",
            {"drifted"},
            450.0,
        ),
        (
            "unsaturated trial",
            Window(rate=1150.0, running=145.0, queued=25.0, queue_share=0.2),
            "revert",
            {"inconclusive"},
            450.0,
        ),
        ("error guardrail", Window(rate=1150.0, error_share=0.05), "revert", {"guardrail"}, 450.0),
        (
            "retraction guardrail",
            Window(rate=1150.0, retractions_per_min=30.0),
            "revert",
            {"guardrail"},
            450.0,
        ),
        ("TTFT guardrail", Window(rate=1150.0, ttft_p95_s=5.0), "revert", {"guardrail"}, 450.0),
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
    baseline = window(base_w, 11)
    decision, when = run_gate(window(trial, 12), baseline)
    assert decision.action == action, (name, decision.rule, decision.reasons)
    assert decision.verdict in verdicts, (name, decision.verdict, decision.rule)
    assert when <= max_time, (name, when)
    assert decision.rule and decision.reasons
    assert decision.baseline is not None and decision.baseline.mean == pytest.approx(1000, rel=0.05)


def test_clear_improvement_reports_effect_interval() -> None:
    decision, _ = run_gate(window(Window(rate=1150.0), 3), window(BASE, 4))
    assert decision.action == "keep"
    assert decision.effect is not None
    assert decision.effect.low < 0.15 < decision.effect.high
    assert decision.effect.mean == pytest.approx(0.15, abs=0.05)
    assert decision.trial is not None and decision.batches >= SETTINGS.min_batches
    assert "3%" in decision.rule


def test_small_gain_below_min_effect_is_not_kept() -> None:
    keeps = 0
    for seed in range(20):
        decision, _ = run_gate(window(Window(rate=1010.0), 500 + seed), window(BASE, seed))
        keeps += decision.action == "keep"
    assert keeps <= 2


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


def test_null_effect_false_keep_rate() -> None:
    """200 experiments with no true effect: the gate keeps at most ~5% of them."""
    settings = replace(SETTINGS, max_trial_s=600.0)
    base_w = replace(BASE, seconds=600.0, with_optional=False)
    trial_w = replace(base_w, seconds=600.0)
    keeps = 0
    for seed in range(200):
        decision, _ = run_gate(window(trial_w, 10_000 + seed), window(base_w, seed), settings)
        keeps += decision.action == "keep"
    assert keeps / 200 <= 0.05
