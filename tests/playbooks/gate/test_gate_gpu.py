"""The gate over experiments recorded on real GPUs: SGLang 0.5.17, 150 closed-loop clients,
through kvpilot's own command line and process launcher (`make test-gpu`, the experiment
phases; docs/gpu.md).

- H200, `mem_fraction_static` 0.30 -> 0.82: at 0.30 about 96 requests ran and 53 waited; at
  0.82 all 150 ran and the queue was gone. Before the gate judged such a trial, it reverted the
  change as "not saturated".
- H100, 0.30 -> 0.45: a raise that leaves the server KV-bound (queue in both windows): kept.
- H100, at 0.82 (all 150 running, no queue), `max_running_requests=48`: the cap made requests
  wait and the decode rate fell. The gate reverted it, but as "the baseline was not
  saturated", as if nothing could be told; a change that cannot serve the load the baseline
  served is measurably worse, and the verdict now says so."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from playbooks.engines import restore_snapshot
from playbooks.engines.base import Snapshot
from playbooks.gate import GateSettings, decide

RUN = Path(__file__).parents[2] / "fixtures" / "gpu" / "h200-sglang-0.5.17"
# the gate the experiment ran with (`--gate` of the run, stored with it)
SETTINGS = GateSettings(baseline_s=120, batch_s=15, scrape_s=5, warmup_floor_s=30, max_trial_s=270)


H100 = Path(__file__).parents[2] / "fixtures" / "gpu" / "h100-sglang-0.5.17"
H100_SETTINGS = replace(SETTINGS, max_trial_s=200)


def windows(path: Path = RUN / "experiment-samples.jsonl") -> tuple[list[Snapshot], list[Snapshot]]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    read = {
        p: [restore_snapshot(r["metrics"], r["t"]) for r in rows if r["phase"] == p]
        for p in ("baseline", "trial")
    }
    return read["baseline"], read["trial"]


def test_the_recorded_queue_clearing_raise_is_kept() -> None:
    baseline, trial = windows()
    decision = decide(baseline, trial, SETTINGS)
    assert decision.action == "keep" and decision.verdict == "improved", decision.rule
    assert "the queue that limited the baseline is gone" in decision.rule
    assert decision.effect is not None and 0.03 < decision.effect.low < decision.effect.mean
    recorded = json.loads((RUN / "experiment-clear.json").read_text())
    assert recorded["state"] == "kept" and recorded["final_fraction"] == 0.82


def test_the_same_trial_with_its_rate_falling_is_not_kept() -> None:
    """The queue gone while the decode rate fell is a changed workload, not a gain."""
    baseline, trial = windows()
    slower = [
        replace(
            s,
            decode_rate=None if s.decode_rate is None else s.decode_rate * 0.8,
            decoded_tokens=None,
        )
        for s in trial
    ]
    decision = decide([replace(s, decoded_tokens=None) for s in baseline], slower, SETTINGS)
    assert decision.action == "revert" and decision.verdict == "inconclusive", decision.rule
    assert "while the decode rate fell" in decision.rule


def test_the_recorded_kv_bound_raise_is_kept() -> None:
    baseline, trial = windows(H100 / "experiment-raise-0.45-samples.jsonl")
    decision = decide(baseline, trial, H100_SETTINGS)
    assert decision.action == "keep" and decision.verdict == "improved", decision.rule
    assert "lower bound" not in decision.rule  # requests still waited: the gain is the gain
    assert decision.effect is not None and decision.effect.low > 0.15
    recorded = json.loads((H100 / "experiment-raise-0.45.json").read_text())
    assert recorded["state"] == "kept" and recorded["final_fraction"] == 0.45


def test_a_cap_that_makes_requests_wait_is_reverted_as_worse() -> None:
    baseline, trial = windows(H100 / "experiment-cap-48-samples.jsonl")
    decision = decide(baseline, trial, H100_SETTINGS)
    assert decision.action == "revert" and decision.verdict == "not_improved", decision.rule
    assert "made requests wait" in decision.rule and "not saturated" not in decision.rule
    assert decision.effect is not None and decision.effect.high < 0
    recorded = json.loads((H100 / "experiment-cap-48.json").read_text())
    assert recorded["state"] == "reverted" and "not saturated" in recorded["reason"]


def test_the_recorded_small_raise_is_kept() -> None:
    """0.30 -> 0.36 on the H100, still KV-bound (about 35 running before, 45 after)."""
    baseline, trial = windows(H100 / "experiment-raise-0.36-samples.jsonl")
    decision = decide(baseline, trial, H100_SETTINGS)
    assert decision.action == "keep" and decision.verdict == "improved", decision.rule
    assert decision.effect is not None and decision.effect.low > 0.03
    recorded = json.loads((H100 / "experiment-raise-0.36.json").read_text())
    assert recorded["state"] == "kept" and recorded["final_fraction"] == 0.36


def test_a_cap_that_cuts_a_waiting_batch_is_reverted() -> None:
    """A cap of 40 on a KV-bound server running about 70 (requests waited before and after):
    measured harm, reverted as not improved."""
    baseline, trial = windows(H100 / "experiment-cap-40-samples.jsonl")
    decision = decide(baseline, trial, H100_SETTINGS)
    assert decision.action == "revert" and decision.verdict == "not_improved", decision.rule
    assert decision.effect is not None and decision.effect.high < 0
    recorded = json.loads((H100 / "experiment-cap-40.json").read_text())
    assert recorded["state"] == "reverted"
    assert recorded["final_value"] == {"max_running_requests": None}  # the cap gone again


def test_a_raise_that_leaves_a_short_queue_is_kept_as_recorded() -> None:
    """0.45 -> 0.60 on the H100: about 72 running and 76 waiting before, 125-137 running and
    13-25 waiting after. The decode rate settled slowly after the restart (MSER held the verdict
    back twice); the replay gives the recorded +12.3% (95% +5.2..+19.9%)."""
    baseline, trial = windows(H100 / "experiment-raise-0.60-samples.jsonl")
    decision = decide(baseline, trial, H100_SETTINGS)
    assert decision.action == "keep" and decision.verdict == "improved", decision.rule
    assert decision.effect is not None
    assert round(decision.effect.mean, 3) == 0.123 and round(decision.effect.low, 3) == 0.052
    recorded = json.loads((H100 / "experiment-raise-0.60.json").read_text())
    assert recorded["state"] == "kept" and recorded["final_fraction"] == 0.6
    assert recorded["final_capacity"] == 262_947
