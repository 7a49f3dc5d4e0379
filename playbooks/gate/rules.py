"""The gate's decision table: ordered rules over one `Look`, the first that applies decides.

The order is part of the design, and it is this (`RULES`):

 1. cap while waiting       the cap came before the trial could be judged: revert, inconclusive
 2. waiting                 too few samples, the warm-up not over, or too few batches after it
 3. decode rate zero        nothing generated after the warm-up: the change broke throughput
 4. guardrail               errors, retractions or TTFT p95 rose: revert whatever throughput says
 5. latency target broken   the trial's p99 interval lies above a configured target (or, where
                            the baseline was already above it, the trial is clearly worse): revert
 6. drifted                 the load or request mix changed between the windows: not comparable
 7. queue made, rate fell   the baseline served every request offered (no queue); the trial
                            made them wait and its decode rate fell significantly: revert, worse
 8. not saturated           the baseline's queue was mostly empty: throughput cannot show an
                            effect (an empty trial queue after a saturated baseline is rule 9's)
 9. queue gone, rate fell   the baseline's queue is gone and the decode rate fell: the offered
                            load changed, so the windows are not comparable: revert, inconclusive
10. cap waiting for rates   a significant gain, but the cap came before enough requests completed
11. waiting for rates       a significant gain; completed requests are compared before a keep
12. cap waiting for latency a significant gain, but the cap came before a target was measured
13. waiting for latency     a significant gain; each latency target is measured before a keep
14. completed rate fell     a significant gain, but completed requests' tokens/s fell: revert
15. improved               significant and at least `min_effect`: keep
16. futile                 the planning effect is ruled out: revert, no significant improvement
17. cap                    the cap came without a clear answer: revert, inconclusive
18. not yet clear          continue

Rules 1-3 run before the effect can be estimated; from rule 4 on the look has its evidence.
Guardrails and validity come before any throughput verdict, so a keep is never built on a
broken or incomparable comparison. Every inconclusive end reverts.

A trial whose queue emptied after a saturated baseline is judged, not set aside: the change
made room for the requests that used to wait, so the trial served the offered load at a rate
the baseline could not reach, and a significant gain is a lower bound on what the change buys
(the verdict says so). Only where the rate fell with the queue is the trial not comparable.
The mirror case is judged too: a baseline with no queue served every request offered, so a
trial that makes them wait while decoding significantly fewer tokens a second cannot serve that
load (a cap below the running count did this on a real H100); only a trial that cannot be told
apart from the baseline is left "not saturated".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from playbooks.engines.base import Snapshot
from playbooks.gate import latency
from playbooks.gate.decision import Action, GateDecision, Verdict
from playbooks.gate.look import Look, read_look
from playbooks.gate.settings import GateSettings
from playbooks.stats.intervals import Interval

Shown = tuple[Interval, Interval | None, Interval | None]
INCONCLUSIVE_REVERTS = "an inconclusive trial reverts by default"
DEFAULT_SETTINGS = GateSettings()


# ------------------------------------------------------------------------- what a rule shows


def _measured(look: Look) -> Shown:
    """The pooled baseline, the trial and the effect, once the trial has evidence."""
    ev = look.evidence
    return (look.baseline, None, None) if ev is None else (ev.baseline, ev.trial, ev.effect)


def _zero(look: Look) -> Shown:
    """A trial that generated nothing: its rate is zero and the effect -100%."""
    k = look.batches
    return look.baseline, Interval(0.0, 0.0, 0.0, k, 0.0), Interval(-1.0, -1.0, -1.0, k, 0.0)


def _no_notes(look: Look) -> list[str]:
    """Waiting, or a broken trial: there is no effect to explain yet."""
    return []


def _inconclusive_notes(look: Look) -> list[str]:
    """The evidence so far, if any, and that the trial reverts for want of an answer."""
    return [*(_evidence_notes(look) if look.evidence else []), INCONCLUSIVE_REVERTS]


@dataclass(frozen=True)
class Rule:
    """One row of the table: when it applies, the answer it gives and how it explains it."""

    name: str
    applies: Callable[[Look], bool]
    action: Action
    verdict: Verdict
    says: Callable[[Look], str]
    notes: Callable[[Look], list[str]] = _no_notes
    shows: Callable[[Look], Shown] = _measured

    def decision(self, look: Look) -> GateDecision:
        """This rule's answer for the look it applies to."""
        baseline, trial, effect = self.shows(look)
        return GateDecision(
            action=self.action,
            verdict=self.verdict,
            baseline=baseline,
            trial=trial,
            effect=effect,
            rule=self.says(look),
            batches=look.batches,
            batch_s=look.settings.batch_s,
            warmup_cut_s=look.cut_s,
            reasons=self.notes(look),
            latency=(
                look.evidence.latency
                if look.evidence is not None
                else latency.not_yet_judged(look.settings)
            ),
            unread_s=look.unread_s,
        )


# ------------------------------------------------------------------------- texts


def awaited(look: Look) -> str | None:
    """What the trial still waits for before its effect can be estimated (None: nothing)."""
    s = look.settings
    if look.samples < 2:
        return "trial samples"
    if not look.warmed_up:
        return (
            f"the warm-up to end: {look.since_restart_s:.0f} s after the restart the decode rate "
            "is still settling (MSER would cut half the trial)"
        )
    if look.batches < s.min_batches or look.trial_mean is None:
        return (
            f"{s.min_batches} trial batches of {s.batch_s:g} s after the {look.cut_s:.0f} s warm-up"
        )
    return None


def effect_text(look: Look) -> str:
    """The effect, its interval and the window it was read over (the time measured: batches
    nobody read, while kvpilot was down, are said and not counted)."""
    effect, s = look.judged.effect, look.settings
    unread = f" ({look.unread_s / 60:.1f} min unread, not counted)" if look.unread_s > 0 else ""
    return (
        f"{effect.mean:+.1%} ({1 - s.alpha:.0%} interval {effect.low:+.1%} … {effect.high:+.1%}) "
        f"over {look.judged.window_s / 60:.1f} min measured after a {look.cut_s:.0f} s "
        f"warm-up{unread}, {look.since_restart_s / 60:.1f} min after the restart"
    )


def _queue_gone_text(look: Look) -> str:
    """What the queue did: the baseline's requests waited, the trial's (mostly) did not."""
    baseline, trial = look.judged.queue_shares
    return (
        f"the queue that limited the baseline is gone (requests waited in {baseline:.0%} of the "
        f"baseline's scrapes and {trial:.0%} of the trial's)"
    )


def _queue_made_text(look: Look) -> str:
    """What the queue did: the baseline's requests ran at once, the trial's waited."""
    baseline, trial = look.judged.queue_shares
    return (
        f"requests waited in {baseline:.0%} of the baseline's scrapes and {trial:.0%} of the "
        "trial's, so it cannot serve the load the baseline served"
    )


def _improved_text(look: Look) -> str:
    """A keep: the gain, and where the change cleared the queue, that it is a lower bound."""
    said = (
        f"the decode rate rose significantly and by at least {look.settings.min_effect:.0%}: "
        f"{effect_text(look)}"
    )
    if look.judged.queue_cleared:
        said += (
            f"; {_queue_gone_text(look)}, so {look.judged.effect.mean:+.1%} is a lower bound "
            "(the trial served every request offered)"
        )
    return said


def _evidence_notes(look: Look) -> list[str]:
    """The decode rates, the change and its standard error, for a throughput verdict."""
    ev, s = look.judged, look.settings
    b, t, est = ev.baseline, ev.trial, ev.estimate
    return [
        f"decode rate: baseline {b.mean:.0f} tokens/s ({b.low:.0f} … {b.high:.0f}), trial "
        f"{t.mean:.0f} tokens/s ({t.low:.0f} … {t.high:.0f}), {1 - s.alpha:.0%} intervals",
        f"decode-rate change {effect_text(look)}",
        f"standard error {est.se:.1%} (trial {math.sqrt(est.trial_variance):.1%} with the "
        f"restart allowance x{s.restart_variance_factor:g}, baseline "
        f"{math.sqrt(est.baseline_variance):.1%})",
        *(check.text for check in ev.latency),
    ]


def _futility_text(look: Look) -> str:
    """Why a revert for futility: the planning gain is ruled out, and how small the gain is."""
    s = look.settings
    why = (
        f"no significant improvement: a gain of {s.planning_effect:.0%} is ruled out "
        f"(one-sided {1 - s.beta:.0%})"
    )
    if look.surely_small:
        why += f", and the gain is below {s.min_effect:.0%} with {1 - s.alpha / 2:.1%} confidence"
    elif look.significant:
        why += f", and the estimate is below the {s.min_effect:.0%} minimum"
    return f"{why}: {effect_text(look)}"


def _cap_text(look: Look, waiting: str) -> str:
    """The trial hit `max_trial_s`; `waiting` says in what state."""
    return f"the cap of {look.settings.max_trial_s:g} s was reached {waiting}"


# ------------------------------------------------------------------------- predicates


def _judged_and(test: Callable[[Look], bool]) -> Callable[[Look], bool]:
    """A predicate that holds once the look has evidence and `test` holds on it."""
    return lambda look: look.evidence is not None and test(look)


def _guards(look: Look) -> tuple[str, ...]:
    """What the guardrails found (errors, retractions, TTFT p95)."""
    return look.judged.guardrails


def _drift(look: Look) -> tuple[str, ...]:
    """How the load or request mix differed between the windows."""
    return look.judged.drift


def _unsaturated(look: Look) -> tuple[str, ...]:
    """Which window had a mostly empty queue, where that leaves the comparison without meaning:
    always where the baseline's was (its throughput was the offered load, not what its
    configuration could do); an empty trial queue after a saturated baseline is the change
    making room, judged by the rules after this one."""
    return () if look.judged.queue_cleared else look.judged.saturation


def _queue_gone_slower(look: Look) -> bool:
    """The baseline's queue is gone and the decode rate fell: fewer requests were offered."""
    return look.judged.queue_cleared and look.judged.estimate.d < 0


def _found(pick: Callable[[Look], tuple[str, ...]]) -> Callable[[Look], bool]:
    """A predicate: the look has evidence and `pick` finds something wrong in it."""
    return _judged_and(lambda look: bool(pick(look)))


def _listed(pick: Callable[[Look], tuple[str, ...]]) -> Callable[[Look], list[str]]:
    """Notes: the findings `pick` lists, then the effect."""
    return lambda look: [*pick(look), effect_text(look)]


def _broken_targets(look: Look) -> tuple[str, ...]:
    """The latency targets the change broke, each with its numbers and interval."""
    return tuple(c.text for c in look.judged.latency if c.verdict == "broken")


def _unmeasured_targets(look: Look) -> tuple[str, ...]:
    """The latency targets still waiting for enough measured batches."""
    return tuple(c.text for c in look.judged.latency if latency.blocks_keep(c))


def _gain_without_latency(look: Look) -> bool:
    """A keep-worthy gain, but a configured latency target is not measured yet."""
    return look.evidence is not None and look.gain and bool(_unmeasured_targets(look))


def _gain_without_rates(look: Look) -> bool:
    """A keep-worthy gain, but too few requests completed yet to check their mix and rate."""
    return look.evidence is not None and look.gain and not look.evidence.rates_ready


def _completed_fell(look: Look) -> str:
    """The completed-token check's objection to a keep ("" when it has none)."""
    return look.judged.completed_rate_fell or ""


# ------------------------------------------------------------------------- the table

RULES: tuple[Rule, ...] = (
    Rule(
        "cap while waiting",
        lambda look: look.at_cap and awaited(look) is not None,
        "revert",
        "inconclusive",
        lambda look: _cap_text(look, f"while waiting for {awaited(look)}"),
        notes=_inconclusive_notes,
    ),
    Rule(
        "waiting",
        lambda look: awaited(look) is not None,
        "continue",
        "pending",
        lambda look: f"waiting for {awaited(look)}",
    ),
    Rule(
        "decode rate zero",
        lambda look: look.trial_mean is not None and look.trial_mean <= 0,
        "revert",
        "not_improved",
        lambda look: (
            f"the decode rate fell to zero after the warm-up ({look.batches} batches of "
            f"{look.settings.batch_s:g} s)"
        ),
        shows=_zero,
    ),
    Rule(
        "guardrail",
        _found(_guards),
        "revert",
        "guardrail",
        lambda look: _guards(look)[0],
        notes=_listed(_guards),
    ),
    Rule(
        "latency target broken",
        _found(_broken_targets),
        "revert",
        "guardrail",
        lambda look: _broken_targets(look)[0],
        notes=_evidence_notes,
    ),
    Rule(
        "drifted",
        _found(_drift),
        "revert",
        "drifted",
        lambda look: (
            "the load changed between the windows, so the comparison is not valid: "
            + _drift(look)[0]
        ),
        notes=_listed(_drift),
    ),
    Rule(
        "queue made, rate fell",
        _judged_and(lambda look: look.judged.queue_formed and look.significantly_worse),
        "revert",
        "not_improved",
        lambda look: (
            "the change made requests wait and decoded fewer tokens: the decode rate fell "
            f"significantly, {effect_text(look)}; {_queue_made_text(look)}"
        ),
        notes=_evidence_notes,
    ),
    Rule(
        "not saturated",
        _found(_unsaturated),
        "revert",
        "inconclusive",
        lambda look: "throughput cannot show an effect: " + _unsaturated(look)[0],
        notes=_listed(_unsaturated),
    ),
    Rule(
        "queue gone, rate fell",
        _judged_and(_queue_gone_slower),
        "revert",
        "inconclusive",
        lambda look: (
            "the windows are not comparable: "
            + _queue_gone_text(look)
            + f" while the decode rate fell ({look.judged.effect.mean:+.1%}), so fewer requests "
            "were offered (a change cannot empty a queue by serving fewer tokens)"
        ),
        notes=_inconclusive_notes,
    ),
    Rule(
        "cap waiting for rates",
        lambda look: look.at_cap and _gain_without_rates(look),
        "revert",
        "inconclusive",
        lambda look: _cap_text(
            look,
            f"while waiting for {look.settings.min_requests_for_rates} requests to complete: "
            + effect_text(look),
        ),
        notes=_inconclusive_notes,
    ),
    Rule(
        "waiting for rates",
        _gain_without_rates,
        "continue",
        "pending",
        lambda look: (
            f"the gain looks significant ({effect_text(look)}); waiting for "
            f"{look.settings.min_requests_for_rates} requests to complete after "
            f"{look.judged.rates_from_s:.0f} s (one request lifetime) to compare completed "
            "requests"
        ),
        notes=_evidence_notes,
    ),
    Rule(
        "cap waiting for latency",
        lambda look: look.at_cap and _gain_without_latency(look),
        "revert",
        "inconclusive",
        lambda look: _cap_text(
            look, "while waiting to judge the latency targets: " + _unmeasured_targets(look)[0]
        ),
        notes=_inconclusive_notes,
    ),
    Rule(
        "waiting for latency",
        _gain_without_latency,
        "continue",
        "pending",
        lambda look: (
            f"the gain looks significant ({effect_text(look)}); waiting to judge the latency "
            f"targets: {_unmeasured_targets(look)[0]}"
        ),
        notes=_evidence_notes,
    ),
    Rule(
        "completed rate fell",
        _judged_and(lambda look: look.gain and bool(_completed_fell(look))),
        "revert",
        "guardrail",
        _completed_fell,
        notes=lambda look: [*_evidence_notes(look), _completed_fell(look)],
    ),
    Rule(
        "improved",
        _judged_and(lambda look: look.gain),
        "keep",
        "improved",
        _improved_text,
        notes=_evidence_notes,
    ),
    Rule(
        "futile",
        _judged_and(lambda look: look.futile),
        "revert",
        "not_improved",
        _futility_text,
        notes=_evidence_notes,
    ),
    Rule(
        "cap",
        _judged_and(lambda look: look.at_cap),
        "revert",
        "inconclusive",
        lambda look: _cap_text(look, f"without a clear answer: {effect_text(look)}"),
        notes=_inconclusive_notes,
    ),
    Rule(
        "not yet clear",
        _judged_and(lambda look: True),
        "continue",
        "pending",
        lambda look: f"not yet clear: {effect_text(look)}",
        notes=_evidence_notes,
    ),
)


def first_rule(look: Look, rules: Sequence[Rule] = RULES) -> Rule:
    """The first rule of the table that applies to the look."""
    for rule in rules:
        if rule.applies(look):
            return rule
    raise ValueError("no gate rule applies: the table must end with a rule that always does")


def decide(
    baseline: Sequence[Snapshot],
    trial: Sequence[Snapshot],
    settings: GateSettings = DEFAULT_SETTINGS,
) -> GateDecision:
    """The gate's answer given the whole baseline window and the trial so far.

    Call it again whenever a trial batch arrives. `trial` starts at the restart (its warm-up is
    cut here). Raises ValueError when the baseline cannot serve as a reference.
    """
    look = read_look(baseline, trial, settings)
    return first_rule(look).decision(look)
