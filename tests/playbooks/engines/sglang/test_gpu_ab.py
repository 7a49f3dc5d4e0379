"""The long A/Bs beside the GPU experiments' verdicts: was the gate right, and do kvpilot's
predictions from a long window hold?

SGLang 0.5.17 on one H100 80GB HBM3, the Llama-3-8B architecture with random weights, the same
150 closed-loop clients as the experiments (prompts U(400, 1000), outputs U(1000, 4000)); each
configuration started on its own and read as kvpilot reads a server every 5 s over a
five-minute window after a minute's warm-up (`python3 -m tests.real_gpu.run --phases ab
--ab-side a|b ...`, one side a call; tests/fixtures/gpu/README.md):

- 0.30: about 30 requests running, 120 waiting, 2,872 tokens decoded a second;
- 0.45: about 72 running, 78 waiting, 4,786 a second;
- 0.45 with `--max-running-requests 40`: 40 running, 110 waiting, 3,539 a second, the pool
  51% used.

The experiments judged the same changes in minutes: 0.30 -> 0.45 kept at +48.5% (95% +21.6 ..
+81.4%), `max_running_requests=40` at 0.45 reverted at -30.4% (95% -48.0 .. -6.8%).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from playbooks.diagnose.measure import measurement_of
from playbooks.engines import engine_named, restore_snapshot
from playbooks.engines.base import Snapshot
from playbooks.engines.types import DiagnoseSettings, Option
from playbooks.sources.model_config import LocalModelConfigs
from tests.real_gpu import results

H100 = Path(__file__).parents[3] / "fixtures" / "gpu" / "h100-sglang-0.5.17"
MODEL = H100.parent / "h200-sglang-0.5.17" / "model"  # the same architecture's config.json


def side(name: str) -> dict[str, Any]:
    """One configuration's recorded side (`ab-F.json`, F its fraction and change)."""
    recorded = json.loads((H100 / f"ab-{name}.json").read_text())
    (only,) = recorded["sides"].values()
    return dict(only)


def steady(recorded: dict[str, Any]) -> list[Snapshot]:
    """The readings of the five-minute window, as kvpilot stored them."""
    t0, t1 = recorded["window"]
    return [
        restore_snapshot(s["metrics"], s["t"])
        for s in recorded["samples"]
        if "metrics" in s and t0 <= s["t"] <= t1
    ]


def truth(a: str, b: str) -> tuple[float, float, float]:
    """B against A in tokens decoded a second: the mean and its 95% interval from 15 s
    batches of each window."""
    spreads = [results.side_summary(side(name))["decode_batches"] for name in (a, b)]
    found = results.relative_interval(*spreads)
    assert found is not None
    return found


def option(name: str, change: dict[str, Any], bottleneck: str = "kv_cache") -> Option:
    """kvpilot's option for `change` from side `name`'s window and its server's own report."""
    engine = engine_named("sglang")
    recorded = side(name)
    raw = {**recorded["server_info"], "model_path": str(MODEL)}
    info = engine.parse_settings(raw)
    rules = engine.rules_for(info, DiagnoseSettings(consider=(change,), models=LocalModelConfigs()))
    assessment = rules.assess(measurement_of(steady(recorded)))
    assert assessment.bottleneck == bottleneck
    (found,) = [o for o in assessment.options if o.change == change]
    return found


def test_each_window_was_steady() -> None:
    """A window still settling would make the comparison a comparison of warm-ups."""
    for name in ("0.3", "0.45", "0.45-cap-40"):
        spread = results.side_summary(side(name))["decode_batches"]
        assert spread["batches"] >= 18, spread
        assert abs(spread["second_half"] / spread["first_half"] - 1) < 0.03, (name, spread)
        assert spread["se"] / spread["mean"] < 0.03, (name, spread)


def test_the_kept_raise_was_right() -> None:
    """0.30 -> 0.45: the long A/B measures +67% (95% +59 .. +75%); the experiment kept it at
    +48.5% (95% +21.6 .. +81.4%), whose interval holds the long run's mean."""
    mean, low, high = truth("0.3", "0.45")
    assert 0.60 < mean < 0.74 and low > 0.5, (mean, low, high)
    recorded = json.loads((H100 / "experiment-raise-0.45.json").read_text())
    assert recorded["state"] == "kept" and "95% interval +21.6% … +81.4%" in recorded["reason"]
    assert 0.216 <= mean <= 0.814


def test_predictions_from_each_long_window_hold_the_other_side() -> None:
    """From the 0.30 window kvpilot predicts 0.45's gain, and from the 0.45 window the loss of
    going back to 0.30: both intervals hold what the other side measured."""
    gain = truth("0.3", "0.45")[0]
    up = option("0.3", {"mem_fraction_static": 0.45})
    assert up.verdict == "recommended" and up.predicted_gain is not None
    assert up.predicted_gain[0] <= gain <= up.predicted_gain[1], (up.predicted_gain, gain)
    down = option("0.45", {"mem_fraction_static": 0.3})
    loss = 1 / (1 + gain) - 1
    assert down.verdict == "not_useful" and down.predicted_gain is not None
    assert down.predicted_gain[0] <= loss <= down.predicted_gain[1], (down.predicted_gain, loss)


def test_the_reverted_cap_was_right() -> None:
    """A cap of 40 at 0.45: the long A/B measures -26% (95% -28 .. -24%); the experiment
    reverted it at -30.4% (95% -48.0 .. -6.8%), whose interval holds the long run's mean, and
    kvpilot's prediction from the uncapped window holds it too."""
    mean, low, high = truth("0.45", "0.45-cap-40")
    assert -0.30 < mean < -0.22 and high < -0.2, (mean, low, high)
    recorded = json.loads((H100 / "experiment-cap-40.json").read_text())
    assert recorded["state"] == "reverted" and "-30.4%" in recorded["reason"]
    assert -0.480 <= mean <= -0.068
    cut = option("0.45", {"max_running_requests": 40})
    assert cut.verdict == "not_useful" and cut.predicted_gain is not None
    assert cut.predicted_gain[0] <= mean <= cut.predicted_gain[1], (cut.predicted_gain, mean)


def test_lifting_a_cap_that_holds_the_batch_is_predicted_from_the_capped_window() -> None:
    """From the capped window kvpilot sees the batch at its cap with half the pool free and
    predicts what a higher cap buys: the batch grows to about 70 (uncapped, 72 ran), and the
    interval holds the +35% the uncapped side measured. Before, it said "possible" and
    predicted nothing."""
    gain = truth("0.45-cap-40", "0.45")[0]
    assert 0.30 < gain < 0.40, gain
    raise_ = option("0.45-cap-40", {"max_running_requests": 80}, "compute")
    assert raise_.verdict == "possible" and raise_.predicted_gain is not None
    assert raise_.predicted_gain[0] <= gain <= raise_.predicted_gain[1], (
        raise_.predicted_gain,
        gain,
    )
    assert "51% in use: about 70 requests would fit" in raise_.reasons[0]
