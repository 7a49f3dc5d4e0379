"""The host tier (HiCache) on and off on a real GPU, per workload: does kvpilot's offload advice
agree with what the GPU measured, in sign and roughly in size, and would the gate have kept or
reverted it?

SGLang 0.5.17 on one H100 80GB HBM3, the Llama-3-8B architecture with random weights, at
`mem_fraction_static` 0.45 (a pool of 166,398 tokens), 150 closed-loop clients; side A without
and side B with `--enable-hierarchical-cache --hicache-ratio 2` (332,800 host tokens), each a
fresh server read every 5 s after a warm-up (`python3 -m tests.real_gpu.run --phases ab
--ab-side both --ab-fractions 0.45,0.45 --ab-extra-b=... --ab-profile P`; BENCHMARKS.md):

- `long-context`: prompts of 5,000-7,000 tokens that never return, answers of 500-1,000; four
  minutes a side. B against A: decode -4.4% (95% -7.1 .. -0.6%).
- `working-set` (`working_set_tokens=250000`, 1.5 pools): questions of 50-150 tokens about
  4,000-token documents, answers of 100-300; 150 s a side. 59% of prompt tokens hit the cache
  without the tier, 97% with it; decode +58.3% (95% +52.1 .. +64.8%).
"""

from __future__ import annotations

from typing import Any

import pytest

from playbooks.diagnose.measure import measurement_of
from playbooks.engines import engine_named
from playbooks.engines.types import DiagnoseSettings, Option
from playbooks.gate import GateSettings, decide
from playbooks.sources.host import ConfiguredHost
from playbooks.sources.model_config import LocalModelConfigs
from tests.playbooks.engines.sglang.test_gpu_ab import MODEL, side, steady, truth

TIER = {"enable_hierarchical_cache": True, "hicache_ratio": 2}
HOST_RAM_GIB = 125.0  # the GPU machine's 128 GiB, as /proc/meminfo gives it
# the gate over the recorded windows: 15 s batches of 5 s scrapes, as the experiments ran
GATE = GateSettings(baseline_s=120, batch_s=15, scrape_s=5, warmup_floor_s=30, max_trial_s=270)


def advice(name: str) -> Option:
    """kvpilot's option for switching the tier on, from side A's window of workload `name`."""
    engine = engine_named("sglang")
    recorded = side(f"0.45-{name}")
    info = engine.parse_settings({**recorded["server_info"], "model_path": str(MODEL)})
    settings = DiagnoseSettings(
        consider=(TIER,), models=LocalModelConfigs(), host=ConfiguredHost(HOST_RAM_GIB)
    )
    assessment = engine.rules_for(info, settings).assess(measurement_of(steady(recorded)))
    (found,) = [o for o in assessment.options if o.change == TIER]
    return found


def measured(name: str) -> tuple[float, float, float]:
    return truth(f"0.45-{name}", f"0.45-{name}-hicache")


@pytest.mark.parametrize(
    ("name", "verdict", "kept"),
    [("long-context", "not_useful", False), ("working-set", "recommended", True)],
)
def test_the_advice_and_the_gate_agree_with_the_gpu(name: str, verdict: str, kept: bool) -> None:
    mean, low, high = measured(name)
    assert (mean > 0) == kept and (low > 0 or high < 0), "the GPU's answer was not clear"
    option = advice(name)
    assert option.verdict == verdict, option.reasons
    assert option.predicted_gain is not None
    predicted_low, predicted_high = option.predicted_gain
    assert predicted_low <= mean <= predicted_high, (option.predicted_gain, mean)
    # the gate, A's window as the baseline and B's as the trial
    decision = decide(steady(side(f"0.45-{name}")), steady(side(f"0.45-{name}-hicache")), GATE)
    assert (decision.action == "keep") == kept, decision.rule


def test_the_prediction_says_what_it_rests_on() -> None:
    said = " ".join(advice("working-set").reasons)
    assert "59% of prompt tokens hit the GPU's cache" in said
    assert "if prefixes return from across more than the GPU pool holds" in said
    quiet = " ".join(advice("long-context").reasons)
    assert "no prompt token came back in the window" in quiet


def summary(name: str) -> dict[str, Any]:
    return dict(side(name)["load"])


def test_the_tier_served_what_the_gpu_pool_could_not() -> None:
    """The mechanism, as the clients saw it: with the tier nearly every prompt token of the
    working set hit the cache; without reuse, nothing did either way."""
    assert summary("0.45-working-set")["cache_hit_fraction"] == pytest.approx(0.59, abs=0.01)
    assert summary("0.45-working-set-hicache")["cache_hit_fraction"] > 0.93
    for name in ("0.45-long-context", "0.45-long-context-hicache"):
        assert summary(name)["cache_hit_fraction"] < 0.001
