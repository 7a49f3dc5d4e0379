"""The improve-or-revert gate: did a configuration change raise throughput? (pure functions).

After the bot applies a change and restarts the server, it compares a *baseline* window (the old
configuration, measured just before) with the *trial* window (the new one, from the restart on).
`decide()` is called each time a trial batch arrives; it answers "continue" until the evidence is
clear, then "keep" or "revert". Nothing here reads a clock or does I/O.

The package by role: `settings` (GateSettings and its validation), `warmup` (the MSER cut),
`windows` (the facts, noise and effect read off the samples), `checks` (guardrails and validity),
`latency` (the operator's latency targets: p99 TTFT and ITL per batch, with their interval),
`look` (one look's typed facts), `rules` (the ordered decision table and `decide`), `decision`
(the GateDecision it answers with), `result` (the GateResult an experiment stores from it).

Statistical design (the reference notes on gate statistics, §3; measured in `bench/gate.py`):

* **Primary metric: the decode rate (`Snapshot.decode_rate`).** It is what a configuration changes
  (tokens per second across all running requests), it is refreshed every few decode steps, and it
  responds within seconds of the restart. The completed-token rate (deltas of the
  `generated_tokens` counter, counted when a request *finishes*) arrives in lumps with long
  requests and is biased after a restart (at first only short requests finish), so it is a
  consistency check on a keep, not the gated statistic. Where the engine counts decode tokens
  at every step (SGLang 0.5.23), each reading's rate is that count's increase since the reading
  before (`counted`): the gauge covers only the last few decode steps before a scrape.
* **Warm-up exclusion:** MSER-5 (White 1997) on the trial's decode rate, never less than
  `warmup_floor_s` and never more than half the trial. When MSER's best cut is that ceiling the
  rate is still settling (a long ramp, a cache filling) and the gate waits. A floor of one
  request lifetime was tried and dropped: on a KV-limited server it starts the window on the
  restart's first synchronized throughput peak, which biases the trial upwards (bench/gate.py).
* **The effect** is d = log(trial mean / baseline mean) over the trial's complete batches after
  the warm-up.
* **Its noise is read off the baseline.** A KV-limited server's decode rate oscillates with its
  retraction cycle (minutes long), so batch means are strongly (and negatively) correlated and
  "CV / sqrt(k)" is far from the noise of a k-batch mean. Instead the gate measures, on the
  baseline, how much means over windows as long as the trial's actually vary: overlapping batch
  means at exactly that length (Meketon & Schmeiser 1984), for windows up to a quarter of the
  baseline, scaled as 1/length beyond (which can only overstate the noise of an oscillation),
  never decreasing as the window shrinks. The baseline mean's own noise is the same function at
  the baseline's full length. Once the trial is long enough its own windows are pooled in, so a
  long trial corrects a baseline that happened to look unusually calm or rough. (The estimator is
  `playbooks.stats.batch_means`, which `kvpilot diagnose` uses for its intervals too.)
* **Restart allowance:** after a restart every client reconnects at once, so the oscillation's
  phase is set by the restart instead of being random. A window mean of a phase-locked oscillation
  can then sit up to sqrt(2) times its random-phase standard error away from the long-run mean, in
  the same direction for every trial; the trial's variance is therefore counted
  `restart_variance_factor` (2) times.
* **Sequential decision, at every trial batch:** keep when the effect's lower one-sided 1 - alpha/2
  bound is above 0 *and* the estimate is at least `min_effect`; revert ("no significant
  improvement") when the upper 1 - beta bound is below the planning effect (+10%, or the low
  end of a smaller predicted gain: `settings.sized_for`). The keep rule
  is the fixed-window test's own rule applied at every look (a Pocock-shaped boundary at the
  fixed test's critical value); the futility rule ends a trial as soon as the gain the experiment
  is sized for is ruled out, which is what stops no-gain trials early. Repeated looks would raise
  the false-keep rate of a pure noise model above alpha/2; the restart allowance and the futility
  bound pay for them, and the benchmark measures the rates on the twin (wrong keeps <= 2% at 0% and
  -10%, wrong reverts <= 10% at +10%). A trial still open at `max_trial_s` is "inconclusive",
  which reverts.
* **Guardrails** (revert regardless of throughput): error rate, TTFT p95, retractions per minute,
  completed-token rate, and the configured latency targets (`ttft_p99_s`, `itl_p99_ms`): the
  trial's p99 read per batch from the histograms' increase, reverted only when its interval lies
  above the target (or, where the baseline was already above it, when the trial is clearly
  worse); a keep waits until each target is measured.
  **Validity checks:** offered concurrency (running + queued) or the request mix (prompt and
  output tokens per completed request) differing between the windows ("drifted"), or the baseline
  not saturated (queue mostly empty: throughput then equals offered load and no configuration can
  show an effect; "inconclusive"). A trial whose queue emptied after a saturated baseline is
  judged on its evidence (the change made room for the requests that waited: a significant gain
  is a lower bound), unless its rate fell with the queue (fewer requests offered: "inconclusive").
  Only batches holding a reading count, so a trial resumed after a gap measures what it read.
  Completed requests (their mix, their token rate) are read from
  one request lifetime after the restart (Little's law on the baseline), once
  `min_requests_for_rates` have completed there: before that only the first wave's shortest
  requests have finished. A keep waits for them. Retractions come in bursts, one per cycle, and
  the cold start's first burst is the largest: they are judged over the whole window after the
  warm-up, once a request lifetime has passed.
"""

from playbooks.gate.decision import Action, GateDecision, Verdict
from playbooks.gate.latency import SloCheck, slo_holds
from playbooks.gate.result import GateResult, StoredEstimate
from playbooks.gate.rules import RULES, Rule, decide
from playbooks.gate.settings import GateSettings
from playbooks.gate.warmup import mser_truncation, warmup, warmup_cut
from playbooks.gate.windows import (
    Estimate,
    baseline_noise,
    estimate_effect,
    read_baseline,
    scraped_batches,
    with_ttft_p95,
)

# Batch means and window noise live in playbooks.stats.batch_means; callers of the gate import
# them here.
from playbooks.stats.batch_means import WindowNoise, batch_means, overlapping_window_variance

__all__ = [
    "RULES",
    "Action",
    "Estimate",
    "GateDecision",
    "GateResult",
    "GateSettings",
    "Rule",
    "SloCheck",
    "StoredEstimate",
    "Verdict",
    "WindowNoise",
    "baseline_noise",
    "batch_means",
    "decide",
    "estimate_effect",
    "mser_truncation",
    "overlapping_window_variance",
    "read_baseline",
    "scraped_batches",
    "slo_holds",
    "warmup",
    "warmup_cut",
    "with_ttft_p95",
]
