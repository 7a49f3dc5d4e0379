"""Batch-means measurement on a scripted server and a manual clock."""

from __future__ import annotations

import math
import random

import httpx
import pytest

from playbooks.clock import ManualClock
from playbooks.diagnose.measure import MeasurementError, measure
from playbooks.engines.base import Snapshot, ttft_quantile
from playbooks.engines.sglang.client import SGLangClient
from playbooks.engines.types import MeasurePlan
from playbooks.stats.intervals import lag1_autocorrelation, mean_interval, t_quantile


class Scripted:
    """A fake SGLang /metrics whose values are functions of the manual clock."""

    def __init__(
        self,
        clock: ManualClock,
        noise: float = 40.0,
        seed: int = 1,
        metrics: bool = True,
        restart_at: float | None = None,
        extra: str = "",
        decode_count: float | None = None,
    ) -> None:
        self.clock = clock
        self.decode_count = decode_count  # tokens/s SGLang 0.5.23's decode count grows by
        self.extra = extra  # more exposition lines, the same at every scrape
        self.rng = random.Random(seed)
        self.noise = noise
        self.metrics = metrics
        self.restart_at = restart_at

    def handler(self, request: httpx.Request) -> httpx.Response:
        t = self.clock.now()
        if request.url.path == "/v1/loads":
            return httpx.Response(
                200,
                json={
                    "loads": [
                        {
                            "dp_rank": 0,
                            "num_running_reqs": 10,
                            "num_waiting_reqs": 0,
                            "token_usage": 0.2,
                            "gen_throughput": 300.0,
                            "cache_hit_rate": 0.0,
                        }
                    ]
                },
            )
        if request.url.path != "/metrics" or not self.metrics:
            return httpx.Response(404)
        gen = 800 + self.rng.gauss(0, self.noise)
        base = t if self.restart_at is None or t < self.restart_at else t - self.restart_at
        text = (
            "# TYPE sglang:gen_throughput gauge\n"
            f"sglang:gen_throughput {gen}\n"
            "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 50\n"
            "# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs 100\n"
            "# TYPE sglang:token_usage gauge\nsglang:token_usage 0.95\n"
            "# TYPE sglang:generation_tokens counter\n"
            f"sglang:generation_tokens_total {800 * base}\n"
            "# TYPE sglang:prompt_tokens counter\n"
            f"sglang:prompt_tokens_total {100 * base}\n"
            "# TYPE sglang:num_requests counter\n"
            f"sglang:num_requests_total {base / 4}\n"
            f"# TYPE sglang:new_token_ratio gauge\nsglang:new_token_ratio {0.2 + t / 600}\n"
            "# TYPE sglang:num_grammar_queue_reqs gauge\nsglang:num_grammar_queue_reqs 2\n"
        )
        if self.decode_count is not None:
            text += (
                "# TYPE sglang:realtime_tokens counter\n"
                f'sglang:realtime_tokens_total{{mode="decode"}} {self.decode_count * base}\n'
            )
        return httpx.Response(200, text=text + self.extra)

    def client(self) -> SGLangClient:
        http = httpx.Client(transport=httpx.MockTransport(self.handler), base_url="http://s")
        return SGLangClient(http, wait=lambda *_: 0.0)


def test_adaptive_window_stops_at_the_precision() -> None:
    clock = ManualClock()
    m = measure(Scripted(clock).client(), clock, MeasurePlan(precision=0.02))
    assert m.generation is not None and m.effective is not None
    assert m.generation.mean == pytest.approx(800, rel=0.02)
    assert m.generation.relative_half_width <= 0.02
    assert m.batches >= 8 and 180 <= m.window_s <= 900
    assert "known to ±2%" in m.stop_reason
    assert m.effective.mean == pytest.approx(800, rel=0.01)
    assert m.avg_output_tokens == pytest.approx(3200) and m.avg_prompt_tokens == pytest.approx(400)
    assert m.queue_nonempty_fraction == 1.0


def test_noisy_server_hits_the_cap_and_says_so() -> None:
    clock = ManualClock()
    plan = MeasurePlan(precision=0.01, max_window_s=300)
    m = measure(Scripted(clock, noise=400).client(), clock, plan)
    assert m.window_s == pytest.approx(300, abs=5)
    assert "ended before ±1%" in m.stop_reason


def test_the_decode_count_is_the_generation_rate_where_it_is_exported() -> None:
    """The gauge covers the last few decode steps before a scrape and swings with the prefills
    in them; the decode count's increase covers the whole interval, as the gate reads it, so
    diagnose and the gate measure one rate."""
    clock = ManualClock()
    server = Scripted(clock, noise=400, decode_count=750)
    m = measure(server.client(), clock, MeasurePlan(precision=0.02))
    assert m.generation is not None
    assert m.generation.mean == pytest.approx(750, rel=1e-6)
    assert "known to ±2%" in m.stop_reason and m.window_s == 8 * 30  # the fewest batches
    clock = ManualClock()
    gauge = measure(Scripted(clock, noise=400).client(), clock, MeasurePlan(precision=0.02))
    assert gauge.window_s > 3 * m.window_s  # off the swinging gauge alone


def test_fixed_window_is_never_a_bare_sample() -> None:
    clock = ManualClock()
    m = measure(Scripted(clock).client(), clock, MeasurePlan(fixed_window_s=60))
    assert m.window_s == pytest.approx(60)
    assert m.batch_s == 15 and m.batches >= 3  # a short window is split into four batches
    assert any("complete batches" in n and "wide" in n for n in m.notes)
    with pytest.raises(ValueError, match="too short"):
        MeasurePlan(fixed_window_s=5)


def test_falls_back_on_loads_without_metrics() -> None:
    clock = ManualClock()
    m = measure(Scripted(clock, metrics=False).client(), clock, MeasurePlan(fixed_window_s=120))
    assert m.source == "loads"
    assert m.effective is None
    assert m.generation is not None and m.generation.mean == pytest.approx(300)
    assert any("--enable-metrics" in n for n in m.notes)


HYBRID_POOLS = (
    "# TYPE sglang:full_token_usage gauge\nsglang:full_token_usage 0.4\n"
    "# TYPE sglang:swa_token_usage gauge\nsglang:swa_token_usage 0.95\n"
    "# TYPE sglang:mamba_usage gauge\nsglang:mamba_usage 0\n"
    "# TYPE sglang:max_total_num_tokens_swa gauge\nsglang:max_total_num_tokens_swa 8000\n"
)


def test_a_hybrid_models_pools_are_window_means() -> None:
    clock = ManualClock()
    scripted = Scripted(clock, extra=HYBRID_POOLS)
    m = measure(scripted.client(), clock, MeasurePlan(fixed_window_s=120))
    assert m.token_usage == pytest.approx(0.95)
    assert (m.full_usage, m.swa_usage, m.mamba_usage) == pytest.approx((0.4, 0.95, 0.0))
    assert m.swa_capacity_tokens == 8000
    plain = measure(Scripted(clock).client(), clock, MeasurePlan(fixed_window_s=120))
    assert plain.full_usage is None and plain.swa_capacity_tokens is None


def test_restart_during_measurement_is_an_error() -> None:
    clock = ManualClock()
    with pytest.raises(MeasurementError, match="restarted"):
        measure(Scripted(clock, restart_at=100).client(), clock, MeasurePlan())


def test_statistics_helpers() -> None:
    assert t_quantile(0.975, 10) == pytest.approx(2.228, abs=0.003)
    assert t_quantile(0.975, 30) == pytest.approx(2.042, abs=0.002)
    iv = mean_interval([1.0, 2.0, 3.0, 4.0])
    assert iv.mean == 2.5 and iv.low < 2.5 < iv.high
    ar = [math.sin(i / 5) for i in range(100)]
    assert lag1_autocorrelation(ar) > 0.9
    rng = random.Random(3)
    assert abs(lag1_autocorrelation([rng.random() for _ in range(400)])) < 0.15


def test_ttft_quantile_from_histogram_deltas() -> None:
    before = [[0.1, 10], [1.0, 20], [10.0, 20], [float("inf"), 20]]
    after = [[0.1, 10], [1.0, 30], [10.0, 110], [float("inf"), 110]]
    # 90 new observations: 10 at <= 1 s, 80 at <= 10 s
    a = Snapshot(ttft_buckets=tuple((le, float(n)) for le, n in before))
    b = Snapshot(ttft_buckets=tuple((le, float(n)) for le, n in after))
    assert ttft_quantile(a, b, 0.95) == 10.0
    assert ttft_quantile(a, b, 0.05) == 1.0
    assert ttft_quantile(b, b, 0.95) is None


def test_admission_gauges_are_window_means() -> None:
    clock = ManualClock()
    m = measure(Scripted(clock).client(), clock, MeasurePlan(fixed_window_s=60))
    # scrapes at 5, 10, ... 60 s after the first: the ratio's mean is at 32.5 s
    assert m.new_token_ratio == pytest.approx(0.2 + 32.5 / 600)
    assert m.grammar_queued == pytest.approx(2.0)
    loads = measure(Scripted(clock, metrics=False).client(), clock, MeasurePlan(fixed_window_s=60))
    assert loads.new_token_ratio is None and loads.grammar_queued is None
