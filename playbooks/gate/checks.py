"""The guardrails and validity checks: each returns what it found wrong, in the operator's words.

Guardrails revert a change whatever throughput says (errors, retractions, TTFT, and the
completed-token rate that blocks a keep). Validity checks say when the comparison itself cannot
be trusted: the load or request mix drifted between the windows, or a window was not saturated.
An empty list (or None) means the check passed.
"""

from __future__ import annotations

from playbooks.gate.settings import GateSettings
from playbooks.gate.windows import WindowFacts, ratio_change


def guardrails(
    bf: WindowFacts, tf: WindowFacts, rf: WindowFacts | None, s: GateSettings
) -> list[str]:
    """Errors, retractions and TTFT p95 of the trial (tf, rf) against the baseline (bf)."""
    out: list[str] = []
    if bf.errors_per_request is not None and tf.errors_per_request is not None:
        rise = tf.errors_per_request - bf.errors_per_request
        if rise > s.error_rate_limit:
            out.append(
                f"the error rate rose from {bf.errors_per_request:.2%} to "
                f"{tf.errors_per_request:.2%} of requests (limit +{s.error_rate_limit:.2%})"
            )
    # Retractions come in bursts, one per retraction cycle: judged over the whole window after
    # the warm-up, once the trial has run a request lifetime (the cold start's burst diluted).
    if rf is not None and tf.retractions_per_min is not None:
        limit = s.retractions_per_min_limit
        if bf.retractions_per_min is not None:
            limit = max(limit, s.retractions_factor * bf.retractions_per_min)
        if tf.retractions_per_min > limit:
            out.append(
                f"{tf.retractions_per_min:.1f} retractions per minute after the warm-up "
                f"(limit {limit:.1f}: {s.retractions_per_min_limit:g} or "
                f"{s.retractions_factor:g}x the baseline's, whichever is higher)"
            )
    if (
        bf.ttft_p95_s is not None
        and tf.ttft_p95_s is not None
        and bf.ttft_p95_s > 0
        and tf.ttft_p95_s > s.ttft_p95_factor * bf.ttft_p95_s
    ):
        out.append(
            f"TTFT p95 rose from {bf.ttft_p95_s:.2f} s to {tf.ttft_p95_s:.2f} s "
            f"(limit {s.ttft_p95_factor:g}x)"
        )
    return out


def completed_rate_fell(bf: WindowFacts, tf: WindowFacts, s: GateSettings) -> str | None:
    """Refuse a keep when the completed-token rate clearly fell (enough requests finished)."""
    if (
        bf.effective_rate is None
        or tf.effective_rate is None
        or (tf.completed or 0) < s.min_requests_for_rates
        or (bf.completed or 0) < s.min_requests_for_rates
    ):
        return None
    change = ratio_change(bf.effective_rate, tf.effective_rate)
    if change is not None and change < -s.effective_drop_limit:
        return (
            f"the decode rate rose but completed requests' tokens per second fell by "
            f"{-change:.0%} (limit {s.effective_drop_limit:.0%}): not kept"
        )
    return None


def drift(
    bf: WindowFacts,
    tf: WindowFacts,
    rf: WindowFacts | None,
    s: GateSettings,
    *,
    names: tuple[str, str] = ("the baseline", "the trial"),
) -> list[str]:
    """Requests in flight, and the request mix once completions can tell it, between windows.

    `names` say what the two windows are (a stored baseline is compared with the last minutes)."""
    out: list[str] = []
    change = ratio_change(bf.in_flight, tf.in_flight)
    if change is not None and abs(change) > s.drift_load_limit:
        out.append(
            f"requests in flight (running + queued) averaged {bf.in_flight:.0f} in {names[0]} "
            f"and {tf.in_flight:.0f} in {names[1]} ({change:+.0%}; "
            f"limit ±{s.drift_load_limit:.0%})"
        )
    if rf is not None and (bf.completed or 0) >= s.min_requests_for_rates:
        # The limit widens by what requests running at the windows' edges can do to the ratio
        # (WindowFacts.mix_uncertainty): after a restart the first completions are the short
        # requests, so the same clients read as a mix 16-26% apart (bench/tune.py, incident).
        edges = bf.mix_uncertainty + rf.mix_uncertainty
        limit = s.drift_mix_limit + edges
        for what, a, b in (
            ("prompt", bf.prompt_per_request, rf.prompt_per_request),
            ("output", bf.output_per_request, rf.output_per_request),
        ):
            change = ratio_change(a, b)
            if change is not None and a is not None and b is not None and abs(change) > limit:
                widened = (
                    f" + {edges:.0%} for requests running at the edges" if edges >= 0.005 else ""
                )
                out.append(
                    f"{what} tokens per completed request went from {a:.0f} to {b:.0f} "
                    f"({change:+.0%}; limit ±{s.drift_mix_limit:.0%}{widened})"
                )
    return out


def saturation(bf: WindowFacts, tf: WindowFacts, s: GateSettings) -> list[str]:
    """Windows whose queue was mostly empty: throughput then only shows the offered load."""
    found = (unsaturated("baseline", bf, s), unsaturated("trial", tf, s))
    return [m for m in found if m is not None]


def unsaturated(name: str, f: WindowFacts, s: GateSettings) -> str | None:
    """One window's saturation check (a stored baseline is judged alone, before any trial)."""
    if f.queue_fraction >= s.min_queue_fraction:
        return None
    return (
        f"the {name} was not saturated: the queue was non-empty in only "
        f"{f.queue_fraction:.0%} of scrapes (need {s.min_queue_fraction:.0%})"
    )


def queue_formed(bf: WindowFacts, tf: WindowFacts, s: GateSettings) -> bool:
    """The baseline's queue was mostly empty and the trial's is not: requests now wait.

    The baseline then served the whole offered load. A trial that makes the same load wait
    and decodes fewer tokens a second cannot serve what the baseline served: that is measured
    harm, not a comparison without meaning (a cap below the running count, on a real H100)."""
    return unsaturated("baseline", bf, s) is not None and unsaturated("trial", tf, s) is None


def queue_cleared(bf: WindowFacts, tf: WindowFacts, s: GateSettings) -> bool:
    """The baseline was saturated and the trial is not: requests no longer wait.

    A change that makes room (a larger KV pool) lets the requests that queued run. The trial's
    throughput is then the offered load, which the baseline could not serve: where it is higher,
    the change showed at least that gain; where it is lower, the offered load itself changed."""
    return unsaturated("baseline", bf, s) is None and unsaturated("trial", tf, s) is not None
