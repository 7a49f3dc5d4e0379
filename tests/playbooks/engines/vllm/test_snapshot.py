"""vLLM's metrics to kvpilot's one Snapshot: scrapes of the real vLLM 0.32.0, table-style."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from playbooks.engines import restore_snapshot
from playbooks.engines.base import Metrics, MetricsDisabled
from playbooks.engines.vllm import ENGINE
from playbooks.engines.vllm.client import VLLMClient, parse_metrics
from playbooks.engines.vllm.metrics import (
    KEEP_READINGS,
    Reading,
    Timed,
    reading_of,
    reference,
    remember,
    snapshot_from_metrics,
)
from tests.playbooks.engines.vllm.recorded import metrics_text

SCRAPES = ["metrics_idle_start.txt", "metrics_idle_after.txt"]


def scrape(name: str) -> Metrics:
    return parse_metrics(metrics_text(name))


@pytest.mark.parametrize(
    ("name", "field", "series"),
    [
        (name, field, series)
        for name in SCRAPES
        for field, series in [
            ("running", "vllm:num_requests_running"),
            ("queued", "vllm:num_requests_waiting"),
            ("generated_tokens", "vllm:generation_tokens_total"),
            ("prompt_tokens", "vllm:prompt_tokens_total"),
            ("cached_tokens", "vllm:prompt_tokens_cached_total"),
            ("preemptions", "vllm:num_preemptions_total"),
            ("loaded_back_tokens", "vllm:external_prefix_cache_hits_total"),
            ("kv_usage", "vllm:kv_cache_usage_perc"),
        ]
    ],
)
def test_each_field_is_the_series(name: str, field: str, series: str) -> None:
    m = scrape(name)
    expected = m.get(series)
    assert expected is not None, f"{name} exports {series}"
    assert getattr(ENGINE.snapshot(m), field) == pytest.approx(expected)


def test_deferred_waiting_and_admission_refusals_are_read() -> None:
    """vLLM 0.32 splits the waiting gauge by reason and counts refused admissions; the
    recorded server had five waiting for capacity, none deferred, none refused."""
    snap = ENGINE.snapshot(scrape("metrics_loaded.txt"))
    assert (snap.queued, snap.deferred_queued, snap.rejected_requests) == (5.0, 0.0, 0.0)
    text = metrics_text("metrics_loaded.txt")
    text = text.replace('reason="deferred"} 0.0', 'reason="deferred"} 3.0').replace(
        'reason="max_num_queued_reqs"} 0.0', 'reason="max_num_queued_reqs"} 7.0'
    )
    snap = ENGINE.snapshot(parse_metrics(text))
    assert (snap.deferred_queued, snap.rejected_requests) == (3.0, 7.0)
    assert restore_snapshot(json.loads(json.dumps(snap.to_json()))) == snap


def test_finished_requests_split_into_completed_and_aborted() -> None:
    # recorded after five requests that stopped at max_tokens (finished_reason="length")
    snap = ENGINE.snapshot(scrape("metrics_idle_after.txt"))
    assert (snap.completed_requests, snap.aborted_requests) == (5.0, 0.0)
    idle = ENGINE.snapshot(scrape("metrics_idle_start.txt"))
    assert (idle.completed_requests, idle.aborted_requests) == (0.0, 0.0)  # declared: 0


def test_capacity_is_the_usable_block_pool() -> None:
    # cache_config_info: num_gpu_blocks="256", block_size="128"; one block is the null block
    assert ENGINE.snapshot(scrape("metrics_idle_start.txt")).capacity_tokens == 255 * 128


def test_one_reading_has_no_rate_and_two_have_one() -> None:
    before, after = scrape("metrics_idle_start.txt"), scrape("metrics_idle_after.txt")
    assert ENGINE.snapshot(after).decode_rate is None
    snap = snapshot_from_metrics(after, since=reading_of(before, 10.0), now=30.0)
    assert snap.decode_rate == pytest.approx(286.0 / 20)
    # the recorded prompts shared nothing: 129 prompt tokens looked up, none found
    assert snap.cache_hit_rate == 0.0
    # a restart in between (counters went back) gives no rate rather than a negative one
    assert snapshot_from_metrics(before, reading_of(after, 10.0), 30.0).decode_rate is None


def test_ttft_buckets_are_kept_in_order() -> None:
    m = scrape("metrics_idle_after.txt")
    snap = ENGINE.snapshot(m)
    assert snap.ttft_buckets and dict(snap.ttft_buckets) == m.ttft_buckets
    assert snap.ttft_buckets[-1][1] == 5.0  # five first tokens observed


def test_a_counter_vllm_does_not_export_is_none_not_zero() -> None:
    text = "\n".join(
        line
        for line in metrics_text("metrics_idle_after.txt").splitlines()
        if not line.startswith(("vllm:num_preemptions", "# HELP vllm:num_preemptions"))
        and "TYPE vllm:num_preemptions" not in line
    )
    snap = ENGINE.snapshot(parse_metrics(text + "\n"))
    assert snap.preemptions is None and snap.generated_tokens == 286.0


def test_metrics_without_the_scheduler_gauges_are_no_snapshot() -> None:
    text = "# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens_total 5\n"
    with pytest.raises(MetricsDisabled, match="--disable-log-stats"):
        ENGINE.snapshot(parse_metrics(text))


def second_engine(text: str) -> str:
    """The recorded scrape as a server of two data-parallel engines shows it: every `vllm:`
    sample again under engine="1", the second engine twice as busy, and the cache config's
    num_gpu_blocks the sum over engines (the API process's figure)."""
    out = []
    for line in text.splitlines():
        if 'engine="0"' not in line or not line.startswith("vllm:"):
            out.append(line)
            continue
        if line.startswith("vllm:cache_config_info"):
            summed = line.replace('num_gpu_blocks="256"', 'num_gpu_blocks="512"')
            out += [summed, summed.replace('engine="0"', 'engine="1"')]
            continue
        name, value = line.rsplit(" ", 1)
        factor = 1.0 if "_created" in name or "usage_perc" in name else 2.0
        other = name.replace('engine="0"', 'engine="1"')
        out += [line, f"{other} {float(value) * factor}"]
    return "\n".join(out) + "\n"


def test_engines_are_summed_and_shares_averaged() -> None:
    one = ENGINE.snapshot(scrape("metrics_idle_after.txt"))
    two = ENGINE.snapshot(parse_metrics(second_engine(metrics_text("metrics_idle_after.txt"))))
    assert two.generated_tokens == pytest.approx(3 * (one.generated_tokens or 0))
    assert two.completed_requests == pytest.approx(15.0)
    assert two.capacity_tokens == 2 * 255 * 128
    assert two.kv_usage == pytest.approx(one.kv_usage or 0.0)
    assert two.ttft_buckets[-1][1] == 15.0


def test_a_snapshot_survives_storage() -> None:
    snap = snapshot_from_metrics(
        scrape("metrics_idle_after.txt"), reading_of(scrape("metrics_idle_start.txt"), 0.0), 5.0
    )
    back = restore_snapshot(json.loads(json.dumps(snap.to_json())), t=12.5)
    assert back == snap.at(12.5)


def test_the_spec_asks_prometheus_for_vllms_series() -> None:
    spec = ENGINE.metrics
    text = metrics_text("metrics_idle_start.txt")
    assert spec.prefix == "vllm:" and re.search(rf"^{spec.heartbeat}\{{", text, re.M)
    assert re.search(rf"^{spec.ttft_histogram}\{{", text, re.M)


# ----------------------------------------------------------------------------- rate reference
def generation_exposition(generated: float) -> str:
    """The recorded loaded server's metrics with its generation counter at `generated`."""
    return re.sub(
        r"^(vllm:generation_tokens_total\{[^}]*\}) \S+$",
        lambda m: f"{m.group(1)} {generated}",
        metrics_text("metrics_loaded.txt"),
        flags=re.M,
    )


def timed(at: float, generated: float | None, took: float = 0.0) -> Timed:
    return Timed(Reading(at, generated, None, None), took)


@pytest.mark.parametrize(
    ("history", "now", "expected_at"),
    [
        ([], timed(10, 100), None),  # nothing to compare with
        ([timed(9.5, 90)], timed(10, 100), None),  # under MIN_SPAN_S
        ([timed(8, 80), timed(9.5, 90)], timed(10, 100), 8),  # the newest far enough
        # a slow scrape before (2.4 s) needs 4 x 2.4 s between them: 1.2 s is not enough
        ([timed(8.8, 90, took=2.4)], timed(10, 100, took=0.05), None),
        ([timed(0, 0, took=2.4), timed(8.8, 90, took=2.4)], timed(10, 100, took=0.05), 0),
        ([timed(5, 5000)], timed(10, 100), None),  # the counters went back: restarted
    ],
)
def test_a_rate_is_taken_over_a_span_longer_than_the_scrapes(
    history: list[Timed], now: Timed, expected_at: float | None
) -> None:
    found = reference(history, now)
    assert (found.at if found else None) == expected_at


def test_a_restart_clears_the_history_and_only_the_newest_are_kept() -> None:
    history = [timed(i, 10.0 * i) for i in range(40)]
    kept = remember(history, timed(40, 400))
    assert len(kept) == KEEP_READINGS and kept[-1].reading.at == 40
    assert remember(kept, timed(41, 3)) == [timed(41, 3)]


def test_a_slow_scrape_does_not_make_a_burst_of_decode_rate() -> None:
    """What a real vLLM on two cores did: a 2.4 s scrape, then a fast one 0.06 s later. The
    rate waits for a span long enough instead of reporting 632 tokens over 0.06 s."""
    clock = iter([0.0, 2.4, 2.46, 2.5, 12.0, 12.05])
    counts = iter([6535.0, 7167.0, 9100.0])
    client = VLLMClient(httpx.Client(), clock=lambda: next(clock))
    client.metrics = lambda: parse_metrics(  # type: ignore[method-assign]
        generation_exposition(next(counts))
    )
    assert client.snapshot().decode_rate is None
    assert client.snapshot().decode_rate is None  # 1.28 s after the first's middle: too close
    rate = client.snapshot().decode_rate
    assert rate is not None and 195 < rate < 215  # (9100 - 6535) / (12.025 - 1.2)
