"""Grouped Prometheus reads, taken apart: which servers go together, the batch's selector, and
how its answer is split back per server (the real Prometheus: test_real_group.py)."""

from __future__ import annotations

import httpx
import pytest

from playbooks.engines.sglang import ENGINE as SGLANG
from playbooks.engines.vllm import ENGINE as VLLM
from playbooks.sources.prometheus import PrometheusAPI, PrometheusMetrics, PrometheusUnreachable
from playbooks.sources.prometheus_api import POST_OVER_CHARS, Series
from playbooks.sources.prometheus_group import (
    MARK,
    batch_expression,
    batch_matchers,
    batches,
    equality_labels,
    read_batch,
    split,
)


@pytest.mark.parametrize(
    ("selector", "labels"),
    [
        ('{instance="10.0.0.5:30000"}', {"instance": "10.0.0.5:30000"}),
        ("{job='sglang', instance=`a:1`}", {"job": "sglang", "instance": "a:1"}),
        ('{pod="a\\"b\\\\c"}', {"pod": 'a"b\\c'}),
        ('{instance=~"gpu-7:.*"}', None),  # a regex: the server keeps its own queries
        ('{job="sglang", instance!="a:1"}', None),
        ('{pod="a\\u00e9"}', None),  # an escape not read here
        ('{job="a", job="b"}', None),
        (f'{{{MARK}="x"}}', None),
    ],
)
def test_equality_labels(selector: str, labels: dict[str, str] | None) -> None:
    source = PrometheusMetrics(PrometheusAPI.connect("http://p:9090"), selector, SGLANG.metrics)
    assert equality_labels(source.matchers) == labels


@pytest.mark.parametrize(
    ("members", "matchers"),
    [
        ([{"instance": "a:1"}], 'instance=~"a:1"'),
        ([{"instance": "10.0.0.5:1"}, {"instance": "b:2"}], r'instance=~"10\\.0\\.0\\.5:1|b:2"'),
        ([{"job": "s", "pod": "x"}, {"job": "s", "pod": "y"}], 'job=~"s", pod=~"x|y"'),
        ([{"pod": 'q"(a|b)'}], 'pod=~"q\\"\\\\(a\\\\|b\\\\)"'),
        ([{"pod": ""}, {"pod": "z"}], 'pod=~"|z"'),
    ],
)
def test_batch_matchers(members: list[dict[str, str]], matchers: str) -> None:
    assert batch_matchers(members) == matchers


def S(value: float, **labels: str) -> Series:
    return Series(labels, 100.0, value)


ANSWER = [
    S(1, __name__="sglang:num_running_reqs", instance="a:1", job="s"),
    S(2, __name__="sglang:num_running_reqs", instance="b:2", job="s"),
    S(3, __name__="sglang:num_running_reqs", instance="c:3", job="s"),  # no member's
    S(99.5, instance="a:1", job="s", **{MARK: "heartbeat"}),
    S(98.5, instance="b:2", job="s", **{MARK: "heartbeat"}),
]


@pytest.mark.parametrize(
    ("members", "series", "heartbeats"),
    [
        ([{"instance": "a:1"}], [[1]], [[99.5]]),
        ([{"instance": "a:1"}, {"instance": "b:2"}], [[1], [2]], [[99.5], [98.5]]),
        ([{"instance": "d:4"}], [[]], [[]]),  # down: nothing in the answer
        ([{"instance": "a:1"}, {"instance": "a:1"}], [[1], [1]], [[99.5], [99.5]]),
        ([{"instance": "a:1", "job": "t"}], [[]], [[]]),  # every label must match
        ([{"instance": "b:2", "pod": ""}], [[2]], [[98.5]]),  # absent reads as ""
    ],
)
def test_split(
    members: list[dict[str, str]], series: list[list[float]], heartbeats: list[list[float]]
) -> None:
    shares = split(ANSWER, members)
    assert [[s.value for s in mine] for mine, _ in shares] == series
    assert [[s.value for s in times] for _, times in shares] == heartbeats
    for _, times in shares:
        assert all(MARK not in s.labels for s in times)


def test_batches_by_prometheus_engine_and_labels() -> None:
    def source(url: str, selector: str, vllm: bool = False) -> PrometheusMetrics:
        spec = (VLLM if vllm else SGLANG).metrics
        return PrometheusMetrics(PrometheusAPI.connect(url), selector, spec)

    sources = {
        "a": source("http://p:9090", '{instance="a:1"}'),
        "b": source("http://p:9090", '{instance="b:1"}'),
        "c": source("http://p:9090", '{instance="c:1"}', vllm=True),
        "d": source("http://q:9090", '{instance="d:1"}'),
        "e": source("http://p:9090", '{job="s", instance="e:1"}'),
        "f": source("http://p:9090", '{instance=~"f:.*"}'),
        "g": source("http://p:9090", '{instance="g:1"}'),
    }
    together, alone = batches(sources, cap=2)
    assert [[m.name for m in b] for b in together] == [["a", "b"], ["g"], ["c"], ["d"], ["e"]]
    assert alone == ["f"]


def test_batch_expression_marks_the_heartbeat() -> None:
    source = PrometheusMetrics(PrometheusAPI.connect("http://p:9090"), '{a="1"}', SGLANG.metrics)
    expr = batch_expression(source, 'a=~"1|2"')
    assert expr.startswith(source.expression_for('a=~"1|2"') + " or label_replace(")
    assert f'timestamp(sglang:num_running_reqs{{a=~"1|2"}}), "{MARK}", "heartbeat", "", "")' in expr


def test_a_failed_batch_gives_each_server_its_own_error() -> None:
    sources = {
        f"s{i}": PrometheusMetrics(
            PrometheusAPI.connect("http://127.0.0.1:1", timeout=0.5),
            f'{{instance="10.0.0.{i}:30000"}}',
            SGLANG.metrics,
        )
        for i in range(3)
    }
    (batch,), _ = batches(sources)
    got = read_batch(batch)
    for name, source in sources.items():
        error = got[name]
        assert isinstance(error, PrometheusUnreachable)
        try:
            source.reading()
        except PrometheusUnreachable as own:
            assert str(error) == str(own) and error.query == source.expression
        else:
            raise AssertionError("read without Prometheus")


def test_a_long_query_is_posted() -> None:
    seen: list[tuple[str, int]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, len(request.url.query)))
        data = {"resultType": "vector", "result": []}
        return httpx.Response(200, json={"status": "success", "data": data})

    api = PrometheusAPI(httpx.Client(transport=httpx.MockTransport(answer), base_url="http://p"))
    api.query("up")
    api.query("up{" + "x" * POST_OVER_CHARS + "}")
    assert [m for m, _ in seen] == ["GET", "POST"] and seen[1][1] == 0
