"""The Prometheus metrics source against responses shaped like Prometheus' HTTP API."""

from __future__ import annotations

import math
import re
from typing import Any

import httpx
import pytest

from playbooks.campaigns.room import room_of
from playbooks.clock import ManualClock
from playbooks.diagnose.measure import measure
from playbooks.engines.sglang import ENGINE
from playbooks.engines.sglang.client import (
    SGLangClient,
    SGLangError,
    parse_metrics,
    parse_server_info,
)
from playbooks.engines.sglang.rules import resolve_gpu_memory
from playbooks.engines.sglang.series import SPEC as SGLANG_METRICS
from playbooks.engines.types import DiagnoseSettings, MeasurePlan
from playbooks.engines.vllm.client import VLLMClient
from playbooks.engines.vllm.metrics import SPEC as VLLM_METRICS
from playbooks.sources.gpu import GpuUnavailable
from playbooks.sources.metrics_source import (
    DirectScrape,
    SourcedClient,
    describe_source,
    with_metrics_source,
)
from playbooks.sources.prometheus import (
    AmbiguousSelector,
    DcgmGpuReader,
    NoSeries,
    PrometheusAPI,
    PrometheusMetrics,
    PrometheusQueryFailed,
    PrometheusUnreachable,
    Series,
    StaleSeries,
    Timeline,
    default_selector,
    metrics_from_series,
    parse_selector,
)
from tests import paths
from tests.playbooks.engines.sglang.exposition import exposition, series
from tests.playbooks.sources.prometheus.fake_api import FIXTURES, FakePrometheus, series_of

SELECTOR = '{instance="10.0.0.5:30000"}'


def no_wait(*_: object) -> float:
    return 0.0


def api(fake: FakePrometheus) -> PrometheusAPI:
    return PrometheusAPI(fake.client(), wait=no_wait)


def source(fake: FakePrometheus, selector: str = SELECTOR, **kw: Any) -> PrometheusMetrics:
    return PrometheusMetrics(api(fake), selector, SGLANG_METRICS, **kw)


@pytest.mark.parametrize("dialect", ["twin-0.5.5", "twin-0.5.10", "twin-0.5.23", "real-0.5.23"])
def test_same_structure_as_a_direct_scrape(dialect: str) -> None:
    text = (FIXTURES / dialect / "metrics_2.txt").read_text()
    fake = FakePrometheus()
    fake.add_scrape(fake.now - 2, text)
    got = source(fake).metrics()
    want = parse_metrics(text)
    assert got.samples == pytest.approx(want.samples)
    assert got.counts == want.counts
    assert got.ttft_buckets == want.ttft_buckets
    # Prometheus stores no series for a family that has none (a counter nobody incremented yet
    # with labels), so only families that have samples can be compared.
    with_samples = {f for f in want.families if any(n.startswith(f) for n in want.samples)}
    assert with_samples <= got.families <= want.families
    assert got.has("sglang:gen_throughput") and got.has("sglang:num_running_reqs")


def test_sums_over_label_sets_and_ignores_other_histogram_buckets() -> None:
    fake = FakePrometheus()
    base = {"job": "sglang", "instance": "10.0.0.5:30000"}
    for rank, (running, usage) in enumerate([(40.0, 0.9), (50.0, 0.7)]):
        ranked = {**base, "dp_rank": str(rank)}
        fake.add_series(fake.now - 1, {**ranked, "__name__": "sglang:num_running_reqs"}, running)
        fake.add_series(fake.now - 1, {**ranked, "__name__": "sglang:token_usage"}, usage)
    for le, count in [("1.0", 3.0), ("+Inf", 5.0)]:
        bucket = {**base, "le": le}
        fake.add_series(
            fake.now - 1, {**bucket, "__name__": "sglang:time_to_first_token_seconds_bucket"}, count
        )
        fake.add_series(
            fake.now - 1, {**bucket, "__name__": "sglang:e2e_request_latency_seconds_bucket"}, 9.0
        )
    m = source(fake).metrics()
    assert m.get("sglang:num_running_reqs") == 90.0
    assert m.mean("sglang:token_usage") == pytest.approx(0.8)
    assert m.ttft_buckets == {1.0: 3.0, math.inf: 5.0}
    assert not any("e2e" in name for name in m.samples)
    query = fake.queries[0]
    assert 'instance="10.0.0.5:30000"' in query and "time_to_first_token_seconds_bucket" in query


def test_no_series_names_the_query_and_the_fix() -> None:
    fake = FakePrometheus()
    fake.add_scrape(fake.now - 1, (FIXTURES / "twin-0.5.10" / "metrics_1.txt").read_text())
    with pytest.raises(NoSeries) as info:
        source(fake, '{instance="10.0.0.9:30000"}').metrics()
    text = str(info.value)
    assert 'instance="10.0.0.9:30000"' in text and "query: `{__name__=~" in text
    assert "--enable-metrics" in text and isinstance(info.value, SGLangError)


def test_stale_data_is_refused() -> None:
    fake = FakePrometheus()
    fake.add_scrape(fake.now - 95, (FIXTURES / "twin-0.5.10" / "metrics_1.txt").read_text())
    with pytest.raises(StaleSeries) as info:
        source(fake, max_age_s=30).metrics()
    assert "95 s old (limit 30 s" in str(info.value)
    assert "timestamp(sglang:num_running_reqs" in str(info.value)
    snap = source(fake, max_age_s=120).reading()
    assert snap.age_s == pytest.approx(95) and snap.sampled_at == fake.now - 95


def test_after_a_failed_scrape_the_last_good_one_counts_while_recent() -> None:
    fake = FakePrometheus()
    texts = [(FIXTURES / "twin-0.5.10" / f"metrics_{i}.txt").read_text() for i in (1, 2)]
    fake.add_scrape(fake.now - 3, texts[0])
    fake.add_scrape(fake.now - 2, texts[1])
    fake.failed_scrapes.append(fake.now - 1)
    snap = source(fake, max_age_s=5).reading()
    assert snap.sampled_at == fake.now - 2 and snap.age_s == pytest.approx(2)
    assert snap.metrics.samples == pytest.approx(parse_metrics(texts[1]).samples)
    assert snap.metrics.ttft_buckets == parse_metrics(texts[1]).ttft_buckets
    with pytest.raises(StaleSeries, match=r"is 2 s old \(limit 1.5 s; query: `sglang:num_running"):
        source(fake, max_age_s=1.5).reading()
    with pytest.raises(NoSeries, match="has no SGLang series"):
        source(fake, max_age_s=0.1).reading()  # nothing within 10 x max_age_s either


def test_a_selector_matching_two_servers_is_refused() -> None:
    fake = FakePrometheus()
    text = (FIXTURES / "twin-0.5.10" / "metrics_1.txt").read_text()
    fake.add_scrape(fake.now - 1, text, {"job": "sglang", "instance": "a:30000"})
    fake.add_scrape(fake.now - 1, text, {"job": "sglang", "instance": "b:30000"})
    with pytest.raises(AmbiguousSelector) as info:
        source(fake, '{job="sglang"}').metrics()
    assert "matches 2 scrape targets" in str(info.value) and "b:30000" in str(info.value)


def test_prometheus_down_is_named_with_the_query() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    client = httpx.Client(base_url="http://127.0.0.1:9", transport=httpx.MockTransport(refuse))
    with pytest.raises(PrometheusUnreachable) as info:
        PrometheusMetrics(PrometheusAPI(client, wait=no_wait), SELECTOR, SGLANG_METRICS).metrics()
    text = str(info.value)
    assert "cannot reach Prometheus at http://127.0.0.1:9" in text and "sglang:.+" in text
    assert "Is Prometheus running" in text


def test_bad_query_overload_and_not_prometheus() -> None:
    fake = FakePrometheus()
    with pytest.raises(PrometheusQueryFailed) as info:
        api(fake).query("up{")
    assert "bad_data" in str(info.value) and "`up{`" in str(info.value)
    assert "selector" in info.value.hint

    calls: list[int] = []

    def overloaded_once(request: httpx.Request) -> httpx.Response | None:
        calls.append(1)
        return httpx.Response(503, text="busy") if len(calls) == 1 else None

    fake.fail = overloaded_once
    fake.add_scrape(fake.now - 1, (FIXTURES / "twin-0.5.10" / "metrics_1.txt").read_text())
    assert source(fake).metrics().get("sglang:num_running_reqs") is not None
    assert len(calls) >= 2  # retried

    fake.fail = lambda _r: httpx.Response(200, text="<html>Grafana</html>")
    with pytest.raises(PrometheusQueryFailed) as info:
        source(fake).metrics()
    assert "without Prometheus' JSON" in str(info.value) and "Grafana" in info.value.hint

    fake.fail = lambda _r: httpx.Response(
        422, json={"status": "error", "errorType": "execution", "error": "query timed out"}
    )
    with pytest.raises(PrometheusQueryFailed) as info:
        source(fake).metrics()
    assert "execution: query timed out" in str(info.value)


def test_range_query_and_raw_scrapes() -> None:
    fake = FakePrometheus()
    texts = [(FIXTURES / "twin-0.5.10" / f"metrics_{i}.txt").read_text() for i in (1, 2)]
    t1, t2 = fake.now - 10, fake.now - 5
    fake.add_scrape(t1, texts[0])
    fake.add_scrape(t2, texts[1])
    src = source(fake)
    points = src.series(t1, fake.now, 2.5)
    assert [t for t, _ in points] == [t1, t1 + 2.5, t1 + 5, t1 + 7.5, t1 + 10]
    first, second = parse_metrics(texts[0]), parse_metrics(texts[1])
    key = "sglang:generation_tokens_total"
    assert [m.get(key) for _, m in points] == [first.get(key)] * 2 + [second.get(key)] * 3
    scrapes = src.scrapes(t1 - 1, fake.now)
    assert [t for t, _ in scrapes] == [t1, t2]  # each at its own scrape time
    assert scrapes[1][1].samples == pytest.approx(second.samples)
    assert scrapes[1][1].ttft_buckets == second.ttft_buckets
    with pytest.raises(ValueError, match="Prometheus allows 11000"):
        src.series(0, 1_000_000, 1)
    with pytest.raises(NoSeries, match="between"):
        src.series(t1 - 1000, t1 - 900, 10)


def test_selectors() -> None:
    assert parse_selector('{instance="a:1"}') == 'instance="a:1"'
    loose = "{ job = 'x', instance=~\"gpu-.*\", }"
    assert parse_selector(loose) == "job = 'x', instance=~\"gpu-.*\""
    assert default_selector("http://10.0.0.5:30000") == '{instance="10.0.0.5:30000"}'
    assert default_selector("https://sglang.example") == '{instance="sglang.example:443"}'
    for bad, why in [
        ('instance="a"', "in braces"),
        ("{}", "empty"),
        ("{instance=a}", "cannot read a label matcher"),
        ('{instance="a" job="b"}', "expected a comma"),
        ('{__name__="x"}', "leave out __name__"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_selector(bad)


def test_dcgm_gpu_memory() -> None:
    fake = FakePrometheus()
    host = {"job": "dcgm", "instance": "gpu-7:9400", "Hostname": "gpu-7"}
    for gpu in range(2):
        labels = {**host, "gpu": str(gpu), "UUID": f"GPU-{gpu}", "modelName": "NVIDIA H200"}
        fake.add_series(fake.now - 1, {**labels, "__name__": "DCGM_FI_DEV_FB_USED"}, 1000.0)
        fake.add_series(fake.now - 1, {**labels, "__name__": "DCGM_FI_DEV_FB_FREE"}, 142_000.0)
        fake.add_series(fake.now - 1, {**labels, "__name__": "DCGM_FI_DEV_FB_RESERVED"}, 771.0)
    reader = DcgmGpuReader(api(fake), '{Hostname="gpu-7"}')
    gpus = reader.snapshot()
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].memory_total_mib == 143_771 and gpus[0].name == "NVIDIA H200"
    assert gpus[1].memory_free_bytes == 142_000 << 20
    # diagnose takes GPU memory from the reader when SGLang does not report it (< 0.5.23)
    info = parse_server_info(
        __import__("json").loads((FIXTURES / "twin-0.5.10" / "server_info.json").read_text())
    )
    memory, _notes = resolve_gpu_memory(info, DiagnoseSettings(gpus=reader))
    assert memory is not None and memory.pre_gib == pytest.approx(143_771 / 1024 - 0.5)

    missing = DcgmGpuReader(api(fake), '{Hostname="gpu-8"}')
    with pytest.raises(GpuUnavailable, match="no DCGM_FI_DEV_FB_USED"):
        missing.snapshot()
    # a campaign's room check: the tightest GPU's free memory, or nothing when unreadable
    room = room_of(reader, "DCGM in Prometheus")
    assert room is not None and room.free_gib == pytest.approx(142_000 / 1024)
    assert room_of(missing, "DCGM in Prometheus") is None


def test_timeline_maps_prometheus_time_onto_a_scaled_clock() -> None:
    fake = FakePrometheus()
    clock = ManualClock(500.0)
    line = Timeline.capture(api(fake), clock, scale=60)
    assert line.at(fake.now) == pytest.approx(500.0)
    assert line.at(fake.now - 2) == pytest.approx(500.0 - 120)  # 2 wall s = 120 clock s
    assert line.unix(line.at(fake.now - 7.5)) == pytest.approx(fake.now - 7.5)
    with pytest.raises(ValueError, match="positive"):
        Timeline.capture(PrometheusAPI(fake.client()), clock, scale=0)


def sglang_transport(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/server_info":
        return httpx.Response(200, text=(FIXTURES / "twin-0.5.10" / "server_info.json").read_text())
    return httpx.Response(404)


def fake_sglang() -> SGLangClient:
    transport = httpx.MockTransport(sglang_transport)
    return SGLangClient(httpx.Client(base_url="http://10.0.0.5:30000", transport=transport))


def test_sourced_client_reads_metrics_from_prometheus_and_the_rest_from_sglang() -> None:
    fake = FakePrometheus()
    fake.add_scrape(fake.now - 1, (FIXTURES / "twin-0.5.10" / "metrics_1.txt").read_text())
    sglang = fake_sglang()
    client = with_metrics_source(sglang, source(fake))
    assert isinstance(client, SourcedClient)
    assert client.settings().capacity_tokens > 0
    assert client.metrics().get("sglang:num_running_reqs") is not None
    assert describe_source(client).startswith("Prometheus at http://prometheus.test:9090")
    assert "scraped directly" in describe_source(sglang)
    assert with_metrics_source(sglang, DirectScrape(sglang)) is sglang


class MovingPrometheus(FakePrometheus):
    """A server whose counters advance 100 tokens per wall second, scraped every second."""

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.now += 0.25  # every query takes a little time
        while max(self.scrapes, default=self.now - 2) < self.now - 1:
            t = max(self.scrapes, default=self.now - 2) + 1
            base = {"job": "sglang", "instance": "10.0.0.5:30000"}
            for name, value in [
                ("sglang:gen_throughput", 100.0),
                ("sglang:num_running_reqs", 10.0),
                ("sglang:num_queue_reqs", 3.0),
                ("sglang:generation_tokens_total", 100.0 * t),
                ("sglang:prompt_tokens_total", 20.0 * t),
                ("sglang:num_requests_total", 0.1 * t),
            ]:
                self.add_series(t, {**base, "__name__": name}, value)
        return super().handler(request)


def test_measure_runs_on_the_prometheus_source() -> None:
    fake = MovingPrometheus()
    sglang = fake_sglang()
    client = with_metrics_source(sglang, source(fake))
    m = measure(client, ManualClock(), MeasurePlan(fixed_window_s=60, scrape_s=5, batch_s=15))
    assert m.source == "metrics"
    assert m.generation is not None and m.generation.mean == pytest.approx(100.0)
    assert m.running == 10.0 and m.queued == 3.0


def test_series_of_helper_keeps_labels() -> None:
    rows = series_of('sglang:x{a="1"} 2.0\n', {"job": "j"})
    assert rows == [({"a": "1", "job": "j", "__name__": "sglang:x"}, 2.0)]
    m = metrics_from_series([Series(labels, 0.0, v) for labels, v in rows], SGLANG_METRICS)
    assert m.get("sglang:x") == 2.0


def dp_attention_scrape() -> str:
    """DP attention (tp 4, dp 2) with every scheduler's metrics and priority scheduling."""
    run, cap = "sglang:num_running_reqs", "sglang:max_total_num_tokens"
    lines = [
        *(
            series(run, n, dp_rank=dp, tp_rank=tp, priority=p)
            for dp, tp, p, n in ((0, 0, "", 5), (0, 0, "1", 5), (0, 1, "", 5), (1, 2, "", 7))
        ),
        *(series(cap, 50_000, dp_rank=dp, tp_rank=tp) for dp, tp in ((0, 0), (0, 1), (1, 2))),
        *(series("sglang:token_usage", u, dp_rank=dp) for dp, u in ((0, 0.5), (1, 0.9))),
    ]
    return exposition(*lines)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(dp_attention_scrape(), id="dp-attention"),
        pytest.param((FIXTURES / "real-0.5.23-priority" / "metrics_2.txt").read_text(), id="real"),
    ],
)
def test_ranks_and_priorities_read_from_prometheus_as_from_the_server(text: str) -> None:
    # Prometheus keeps every label set (and drops the empty priority="" of the totals), so the
    # engine combines them from Prometheus exactly as from a direct scrape.
    fake = FakePrometheus()
    fake.add_scrape(fake.now - 1, text)
    assert ENGINE.snapshot(source(fake).metrics()) == ENGINE.snapshot(parse_metrics(text))


def test_dp_attention_from_prometheus_counts_each_dp_rank_once() -> None:
    fake = FakePrometheus()
    fake.add_scrape(fake.now - 1, dp_attention_scrape())
    snap = ENGINE.snapshot(source(fake).metrics())
    assert snap.running == 12 and snap.capacity_tokens == 100_000
    assert snap.kv_usage == pytest.approx(0.7)


def test_a_vllm_decode_rate_through_prometheus_is_the_counters_increase() -> None:
    """vLLM exports its decode rate only as a counter: through Prometheus the server's client
    still keeps the reading before, so the rate is the same as from a direct scrape."""
    recorded = (paths.FIXTURES / "vllm" / "real-0.32.0" / "metrics_loaded.txt").read_text()

    def with_generated(value: float) -> str:
        return re.sub(
            r"^(vllm:generation_tokens_total\{[^}]*\}) \S+$",
            lambda m: f"{m.group(1)} {value}",
            recorded,
            flags=re.M,
        )

    fake = FakePrometheus()
    now = iter([100.0, 110.0])  # when each reading arrived, on the bot's clock
    server = VLLMClient(httpx.Client(base_url="http://10.0.0.5:8000"), clock=lambda: next(now))
    prometheus = PrometheusMetrics(api(fake), '{instance="10.0.0.5:8000"}', VLLM_METRICS)
    client = with_metrics_source(server, prometheus)
    fake.add_scrape(fake.now - 1, with_generated(1000.0), {"instance": "10.0.0.5:8000"})
    first = client.snapshot()
    fake.now += 10
    fake.add_scrape(fake.now - 1, with_generated(3000.0), {"instance": "10.0.0.5:8000"})
    second = client.snapshot()
    assert first.decode_rate is None and first.generated_tokens == 1000.0
    assert second.decode_rate == pytest.approx(200.0)  # 2,000 tokens in 10 s
    assert "Prometheus" in describe_source(client)
