"""The fast exposition reader against `prometheus_client`, the parser it stands in for.

Every recorded `/metrics` (the real SGLang and vLLM, the twin's, the GPU's) and a table of the
format's corners: the reader answers exactly what `prometheus_client` gives for the families it
keeps (names, label values, numbers and their types), or None where it leaves a text to it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from playbooks.engines.base import WrongEngine
from playbooks.engines.kit import engine as kit
from playbooks.engines.kit import exposition
from playbooks.engines.sglang.client import parse_metrics as parse_sglang
from playbooks.engines.sglang.series import SPEC as SGLANG
from playbooks.engines.vllm.client import NotVLLM
from playbooks.engines.vllm.client import parse_metrics as parse_vllm
from playbooks.engines.vllm.metrics import SPEC as VLLM

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
RECORDED = sorted(FIXTURES.rglob("metrics*.txt"))


def reference(text: str, prefix: str, buckets: frozenset[str]) -> exposition.Reading:
    """What `prometheus_client` reads, kept the way the fast reader keeps it."""
    families = [f for f in text_string_to_metric_families(text) if f.name.startswith(prefix)]
    samples = [
        (s.name, s.labels, s.value)
        for f in families
        for s in f.samples
        if not s.name.endswith("_bucket") or s.name in buckets
    ]
    return exposition.Reading(samples, {f.name for f in families})


def typed(reading: exposition.Reading) -> list[tuple[str, dict[str, str], str, type]]:
    """The samples with each number's type, NaN comparable (by its spelling)."""
    return [(name, labels, repr(value), type(value)) for name, labels, value in reading.samples]


def test_every_recorded_metrics_file_is_read() -> None:
    assert len(RECORDED) >= 17  # the real SGLang and vLLM, the twins, the GPU's


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: str(p.relative_to(FIXTURES)))
@pytest.mark.parametrize(
    "spec", [SGLANG, VLLM, None], ids=["sglang-latency", "vllm-latency", "every-bucket"]
)
def test_recorded_exposition_reads_as_prometheus_client_reads_it(path: Path, spec: object) -> None:
    text = path.read_text()
    prefix = "sglang:" if "sglang" in str(path) else "vllm:"
    buckets = frozenset(getattr(spec, "histograms", ())) if spec is not None else frozenset()
    if spec is None:  # every bucket series kept: all the reader's parsing exercised
        buckets = frozenset(
            s.name
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name.endswith("_bucket")
        )
    fast = exposition.read(text, prefix, buckets)
    assert fast is not None, "the recorded text has the common shape: no fallback"
    want = reference(text, prefix, buckets)
    assert fast.families == want.families
    assert typed(fast) == typed(want)
    assert fast.samples, "nothing read: the test would prove nothing"


CORNERS = {
    "plain gauge": "# TYPE sglang:a gauge\nsglang:a 3\n",
    "float and int": "sglang:a 3.5\nsglang:b 7\nsglang:c 1e3\n",
    "nan and infinities": "sglang:a NaN\nsglang:b +Inf\nsglang:c -Inf\n",
    "timestamp ignored": 'sglang:a{x="1"} 2 1700000000000\n',
    "escaped label values": 'sglang:a{p="c:\\\\dir",q="say \\"hi\\"",r="two\\nlines"} 1\n',
    "unknown escape kept": 'sglang:a{p="\\d"} 1\n',
    "braces and commas in a value": 'sglang:a{p="{x,y}",q="}"} 1\n',
    "trailing comma": 'sglang:a{p="1",} 1\n',
    "spaces around labels": 'sglang:a{ p = "1" , q="2" } 1\n',
    "empty labels": "sglang:a{} 1\n",
    "tabs": 'sglang:a{p="1"}\t4\n',
    "crlf": '# TYPE sglang:a gauge\r\nsglang:a{p="1"} 4\r\n',
    "blank lines and comments": "\n# a comment\n#\n   \nsglang:a 1\n\n",
    "counter with _total": "# TYPE sglang:t_total counter\nsglang:t_total 5\n",
    "counter without _total": "# TYPE sglang:t counter\nsglang:t 5\n",
    "counter with _created": (
        "# TYPE sglang:t_total counter\nsglang:t_total 5\nsglang:t_created 1.7e9\n"
    ),
    "histogram": (
        "# HELP sglang:h latency\n# TYPE sglang:h histogram\n"
        'sglang:h_bucket{le="0.1"} 1\nsglang:h_bucket{le="+Inf"} 2\n'
        "sglang:h_count 2\nsglang:h_sum 0.3\nsglang:h_created 1.7e9\n"
    ),
    "summary": (
        '# TYPE sglang:s summary\nsglang:s{quantile="0.5"} 1\nsglang:s_count 2\nsglang:s_sum 3\n'
    ),
    "help after type": "# TYPE sglang:a gauge\n# HELP sglang:a the help\nsglang:a 1\n",
    "sample outside its family": "# TYPE sglang:a gauge\nsglang:a 1\nsglang:b 2\nsglang:a 3\n",
    "other families between": (
        "# TYPE sglang:a gauge\nsglang:a 1\n# TYPE python_gc counter\npython_gc_total 4\n"
        "sglang:a 2\n"
    ),
    "untyped and unknown": (
        "# TYPE sglang:a untyped\nsglang:a 1\n# TYPE sglang:b unknown\nsglang:b 2\n"
    ),
    "other engine only": "# TYPE vllm:a gauge\nvllm:a 1\n",
}


@pytest.mark.parametrize("text", CORNERS.values(), ids=CORNERS.keys())
def test_corners_read_as_prometheus_client_reads_them(text: str) -> None:
    buckets = frozenset({"sglang:h_bucket"})
    fast = exposition.read(text, "sglang:", buckets)
    assert fast is not None
    want = reference(text, "sglang:", buckets)
    assert fast.families == want.families
    assert typed(fast) == typed(want)


LEFT_TO_PROMETHEUS_CLIENT = {
    "quoted metric name": '# TYPE "sglang:a" gauge\nsglang:a 1\n',
    "name inside the braces": '{__name__="sglang:a"} 1\n',
    "reserved label": 'sglang:a{__p="1"} 1\n',
    "help naming nothing": "# HELP\nsglang:a 1\n",
    "unknown type": "# TYPE sglang:a meter\nsglang:a 1\n",
    "underscore in a value": "sglang:a 1_000\n",
    "no value": 'sglang:a{p="1"}\n',
    "unclosed labels": 'sglang:a{p="1" 1\n',
    "repeated label": 'sglang:a{p="1",p="2"} 1\n',
    "html": "<html><body>Not found</body></html>\n",
}


@pytest.mark.parametrize(
    "text", LEFT_TO_PROMETHEUS_CLIENT.values(), ids=LEFT_TO_PROMETHEUS_CLIENT.keys()
)
def test_unusual_text_is_left_to_prometheus_client(text: str) -> None:
    assert exposition.read(text, "sglang:", ()) is None
    try:
        want = reference(text, "sglang:", frozenset())
    except ValueError:
        with pytest.raises(WrongEngine, match="/metrics is not Prometheus text"):
            kit.read_families(text, "sglang:", (), WrongEngine)
        return
    samples, families = kit.read_families(text, "sglang:", (), WrongEngine)
    assert (samples, families) == (want.samples, want.families)


def test_a_skipped_family_is_not_read_past_its_name() -> None:
    """A broken line of a family kvpilot does not keep costs nothing and breaks nothing."""
    text = "python_gc_objects{generation=broken 1\nsglang:a 1\n"
    fast = exposition.read(text, "sglang:", ())
    assert fast is not None and fast.samples == [("sglang:a", {}, 1)]


def test_an_engine_keeps_only_the_latency_histograms_of_its_buckets() -> None:
    text = (FIXTURES / "sglang/real-0.5.23/metrics_2.txt").read_text()
    metrics = parse_sglang(text)
    bucket_series = {name for name in metrics.histograms if name.endswith("_bucket")}
    assert bucket_series == set(SGLANG.histograms)  # (gauges with an `le` label stay too)
    assert metrics.buckets(SGLANG.ttft_histogram) is not None
    assert "sglang:e2e_request_latency_seconds_count" in metrics.samples  # not a bucket: kept


def test_vllm_still_tells_an_sglang_server_apart() -> None:
    text = (FIXTURES / "sglang/real-0.5.23/metrics_2.txt").read_text()
    with pytest.raises(NotVLLM, match="SGLang's"):
        parse_vllm(text)
    assert parse_vllm((FIXTURES / "vllm/real-0.32.0/metrics_loaded.txt").read_text()).families
