"""SGLang's metrics to kvpilot's one Snapshot: recorded real and twin scrapes, table-style."""

from __future__ import annotations

import json
import math

import pytest

from playbooks.engines import restore_snapshot
from playbooks.engines.base import Metrics, MetricsDisabled, Snapshot, ttft_quantile
from playbooks.engines.sglang import ENGINE
from playbooks.engines.sglang.client import parse_loads, parse_metrics
from playbooks.engines.sglang.metrics import snapshot_from_loads
from tests.paths import FIXTURES

FIXTURES = FIXTURES / "sglang"


def scrape(source: str, n: int) -> Metrics:
    return parse_metrics((FIXTURES / source / f"metrics_{n}.txt").read_text())


@pytest.mark.parametrize(
    ("source", "field", "series"),
    [
        (src, field, series)
        for src in ("real-0.5.23", "twin-0.5.10", "twin-0.5.23")
        for field, series in [
            ("decode_rate", "sglang:gen_throughput"),
            ("running", "sglang:num_running_reqs"),
            ("queued", "sglang:num_queue_reqs"),
            ("generated_tokens", "sglang:generation_tokens_total"),
            ("prompt_tokens", "sglang:prompt_tokens_total"),
            ("completed_requests", "sglang:num_requests_total"),
            ("capacity_tokens", "sglang:max_total_num_tokens"),
            ("preempting", "sglang:num_retracted_reqs"),
        ]
    ],
)
def test_each_field_is_the_summed_series(source: str, field: str, series: str) -> None:
    m = scrape(source, 2)
    value = getattr(ENGINE.snapshot(m), field)
    expected = m.get(series)
    assert expected is not None, f"{source} exports {series}"
    assert value == pytest.approx(expected)


@pytest.mark.parametrize("source", ["real-0.5.23", "twin-0.5.10", "twin-0.5.23"])
def test_ratios_are_means_over_ranks_and_buckets_are_kept(source: str) -> None:
    m = scrape(source, 2)
    snap = ENGINE.snapshot(m)
    assert snap.kv_usage == pytest.approx(m.mean("sglang:token_usage"))
    assert snap.source == "metrics"
    assert dict(snap.ttft_buckets) == m.ttft_buckets
    assert [le for le, _ in snap.ttft_buckets] == sorted(le for le, _ in snap.ttft_buckets)


def test_a_counter_sglang_does_not_export_is_none_not_zero() -> None:
    # SGLang 0.5.23 exports no retraction or abort counter (recorded from the real server):
    # a guardrail on them must see "unknown", never "none happened".
    snap = ENGINE.snapshot(scrape("real-0.5.23", 2))
    assert snap.preemptions is None and snap.aborted_requests is None
    assert snap.generated_tokens is not None and snap.generated_tokens > 0


def test_a_declared_counter_that_has_not_counted_is_zero() -> None:
    text = (
        "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 0\n"
        "# TYPE sglang:num_requests counter\n"
    )
    assert ENGINE.snapshot(parse_metrics(text)).completed_requests == 0.0


def test_metrics_without_the_scheduler_gauges_are_no_snapshot() -> None:
    text = "# TYPE sglang:prompt_tokens counter\nsglang:prompt_tokens_total 5\n"
    with pytest.raises(MetricsDisabled, match="no SGLang scheduler metrics"):
        ENGINE.snapshot(parse_metrics(text))


@pytest.mark.parametrize("path", ["twin-0.5.10/v1_loads.json", "twin-0.5.10/get_load.json"])
def test_a_load_report_gives_a_snapshot_without_counters(path: str) -> None:
    snap = snapshot_from_loads(parse_loads(json.loads((FIXTURES / path).read_text())))
    assert snap.source == "loads" and snap.running + snap.queued > 0
    assert not snap.has_counters


def test_a_snapshot_survives_storage() -> None:
    snap = ENGINE.snapshot(scrape("real-0.5.23", 2))
    back = restore_snapshot(json.loads(json.dumps(snap.to_json())), t=12.5)
    assert back == snap.at(12.5)


def test_samples_stored_before_the_seam_are_read_in_sglangs_names() -> None:
    legacy = {
        "sglang:gen_throughput": 1200.0,
        "sglang:num_running_reqs": 50.0,
        "sglang:num_queue_reqs": 100.0,
        "sglang:token_usage": 0.97,
        "sglang:generation_tokens_total": 9000.0,
        "sglang:prompt_tokens_total": 4000.0,
        "sglang:num_requests_total": 18.0,
        "sglang:num_aborted_requests_total": 1.0,
        "sglang:num_retracted_requests_total": 3.0,
        "ttft_buckets": [[1.0, 10.0], [math.inf, 18.0]],
    }
    snap = restore_snapshot(legacy, t=5.0)
    assert snap == Snapshot(
        t=5.0,
        decode_rate=1200.0,
        running=50.0,
        queued=100.0,
        kv_usage=0.97,
        generated_tokens=9000.0,
        prompt_tokens=4000.0,
        completed_requests=18.0,
        aborted_requests=1.0,
        preemptions=3.0,
        ttft_buckets=((1.0, 10.0), (math.inf, 18.0)),
    )


def test_ttft_quantile_between_two_readings() -> None:
    a = Snapshot(ttft_buckets=((0.5, 2.0), (2.0, 4.0), (math.inf, 4.0)))
    b = Snapshot(ttft_buckets=((0.5, 3.0), (2.0, 14.0), (math.inf, 14.0)))
    assert ttft_quantile(a, b, 0.95) == 2.0
    assert ttft_quantile(a, b, 0.05) == 0.5
    assert ttft_quantile(b, b, 0.5) is None


def test_a_restart_shows_as_counters_going_back() -> None:
    before = Snapshot(completed_requests=10.0, generated_tokens=500.0)
    assert Snapshot(completed_requests=2.0, generated_tokens=600.0).counters_went_back(before)
    assert not Snapshot(completed_requests=11.0, generated_tokens=600.0).counters_went_back(before)


def test_a_hybrid_reading_survives_storage_and_older_rows_still_read() -> None:
    hybrid = Snapshot(
        running=3.0, kv_usage=0.93, full_usage=0.41, swa_usage=0.93, swa_capacity_tokens=8000
    )
    stored = json.loads(json.dumps(hybrid.to_json()))
    assert stored["v"] == 2 and restore_snapshot(stored, t=1.0) == hybrid.at(1.0)
    # a row of version 1 has no pool fields: they read back as unknown
    older = {k: v for k, v in stored.items() if not k.endswith(("_usage", "swa_capacity_tokens"))}
    back = restore_snapshot({**older, "v": 1, "kv_usage": 0.93}, t=1.0)
    assert back.kv_usage == 0.93 and back.running == 3.0
    assert (back.full_usage, back.swa_usage, back.mamba_usage, back.swa_capacity_tokens) == (
        None,
        None,
        None,
        None,
    )


@pytest.mark.parametrize(
    ("source", "ratio"),
    [
        ("real-0.5.23", 0.098),
        ("twin-0.5.5", 0.5037),
        ("twin-0.5.10", 0.5337),
        ("twin-0.5.23", 0.3504),
    ],
)
def test_admission_gauges_are_read(source: str, ratio: float) -> None:
    snap = ENGINE.snapshot(scrape(source, 2))
    assert snap.new_token_ratio == pytest.approx(ratio, abs=1e-4)
    assert snap.grammar_queued == 0.0  # exported, nothing waiting: 0, not None


def test_admission_gauges_survive_storage() -> None:
    snap = ENGINE.snapshot(scrape("real-0.5.23", 2))
    back = restore_snapshot(json.loads(json.dumps(snap.to_json())))
    assert (back.new_token_ratio, back.grammar_queued) == (snap.new_token_ratio, 0.0)


@pytest.mark.parametrize(("source", "decoded"), [("real-0.5.23", 25544.0), ("twin-0.5.10", None)])
def test_the_decode_steps_tokens_are_read_where_sglang_counts_them(
    source: str, decoded: float | None
) -> None:
    """0.5.23's `realtime_tokens_total{mode="decode"}` (moved by every decode step), not its
    prefill modes; a server without the family has no count (the gate keeps the gauge)."""
    assert ENGINE.snapshot(scrape(source, 2)).decoded_tokens == decoded


def test_a_server_that_only_prefilled_so_far_has_decoded_nothing() -> None:
    text = (
        "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 1\n"
        "# TYPE sglang:realtime_tokens counter\n"
        'sglang:realtime_tokens_total{mode="prefill_compute",tp_rank="0"} 512\n'
    )
    assert ENGINE.snapshot(parse_metrics(text)).decoded_tokens == 0.0


def test_the_decode_count_sums_dp_ranks_and_counts_one_tp_rank_of_each() -> None:
    text = "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 1\n" + "".join(
        f'sglang:realtime_tokens_total{{dp_rank="{dp}",mode="decode",tp_rank="{tp}"}} {v}\n'
        for dp, tp, v in ((0, 0, 100), (0, 1, 100), (1, 2, 40), (1, 3, 40))
    )
    assert ENGINE.snapshot(parse_metrics(text)).decoded_tokens == 140.0
