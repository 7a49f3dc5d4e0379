"""Responses shaped like Prometheus' HTTP API, built from recorded `/metrics` scrapes.

`FakePrometheus` answers `/api/v1/query` and `/api/v1/query_range` through httpx.MockTransport
the way Prometheus 2.x does: the selector's label matchers filter series, `{...}[Nms]` returns
raw samples (a matrix), `max(timestamp(x{...}))` the newest sample's time, and errors come back
as `{"status": "error", "errorType": ..., "error": ...}` with Prometheus' status codes. It is
only as clever as the queries kvpilot sends, and checks that those are the ones it expects.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests import paths

FIXTURES = paths.FIXTURES / "sglang"
Labels = dict[str, str]


def series_of(text: str, target: Labels) -> list[tuple[Labels, float]]:
    """The series Prometheus stores for one scrape of `text`, with the target's labels (a
    label with an empty value is no label in Prometheus' data model, so it is dropped)."""
    out = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            kept = {k: v for k, v in sample.labels.items() if v != ""}
            labels = {**kept, **target, "__name__": sample.name}
            out.append((labels, float(sample.value)))
    return out


def _fmt(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def _matches(labels: Labels, matchers: list[tuple[str, str, str]]) -> bool:
    for name, op, value in matchers:
        have = labels.get(name, "")
        if op == "=" and have != value:
            return False
        if op == "!=" and have == value:
            return False
        if op == "=~" and not re.fullmatch(value, have):
            return False
        if op == "!~" and re.fullmatch(value, have):
            return False
    return True


@dataclass
class FakePrometheus:
    """Scrapes (Unix time -> series) and the instant the fake's clock reads."""

    scrapes: dict[float, list[tuple[Labels, float]]] = field(default_factory=dict)
    now: float = 1_000_000.0
    queries: list[str] = field(default_factory=list)
    failed_scrapes: list[float] = field(default_factory=list)  # each marks every series stale
    fail: Callable[[httpx.Request], httpx.Response | None] | None = None

    def add_scrape(self, t: float, text: str, target: Labels | None = None) -> None:
        labels = target or {"job": "sglang", "instance": "10.0.0.5:30000"}
        self.scrapes.setdefault(t, []).extend(series_of(text, labels))

    def add_series(self, t: float, labels: Labels, value: float) -> None:
        self.scrapes.setdefault(t, []).append((labels, value))

    # ----------------------------------------------------------------- evaluation
    def _latest(self, at: float, lookback: float = 300.0) -> dict[str, tuple[Labels, float, float]]:
        newest = max((t for t in self.scrapes if t <= at), default=None)
        if newest is not None and any(newest < f <= at for f in self.failed_scrapes):
            return {}  # the last scrape failed: Prometheus' staleness markers hide every series
        out: dict[str, tuple[Labels, float, float]] = {}
        for t in sorted(self.scrapes):
            if at - lookback < t <= at:
                for labels, value in self.scrapes[t]:
                    out[json.dumps(labels, sort_keys=True)] = (labels, t, value)
        return out

    def _select(self, selector: str, at: float) -> list[tuple[Labels, float, float]]:
        matchers = [(m[1], m[2], m[3]) for m in _MATCHER.finditer(selector)]
        return [x for x in self._latest(at).values() if _matches(x[0], matchers)]

    def _instant(self, expr: str, at: float) -> dict[str, Any]:
        if expr == "time()":
            return {"resultType": "scalar", "result": [at, _fmt(at)]}
        stamp = re.fullmatch(r"max\(timestamp\(([a-z_:]+)\{(.*)\}\)\)", expr)
        if stamp:
            found = self._select(f'__name__="{stamp[1]}", {stamp[2]}', at)
            if not found:
                return {"resultType": "vector", "result": []}
            newest = max(t for _, t, _ in found)
            return {"resultType": "vector", "result": [{"metric": {}, "value": [at, _fmt(newest)]}]}
        ranged = re.fullmatch(r"([a-z_:]*)(\{.*\})\[(\d+)(ms|s)\]", expr)
        if ranged:
            window = int(ranged[3]) / (1000 if ranged[4] == "ms" else 1)
            matchers = [(m[1], m[2], m[3]) for m in _MATCHER.finditer(ranged[2])]
            if ranged[1]:
                matchers.append(("__name__", "=", ranged[1]))
            by_series: dict[str, dict[str, Any]] = {}
            for t in sorted(self.scrapes):
                if at - window < t <= at:
                    for labels, value in self.scrapes[t]:
                        if _matches(labels, matchers):
                            key = json.dumps(labels, sort_keys=True)
                            entry = by_series.setdefault(key, {"metric": labels, "values": []})
                            entry["values"].append([t, _fmt(value)])
            return {"resultType": "matrix", "result": list(by_series.values())}
        parts = [p.strip() for p in expr.split(" or ")]
        seen: dict[str, dict[str, Any]] = {}
        for part in parts:
            selector = part
            if not (part.startswith("{") and part.endswith("}")) and "{" in part:
                name, rest = part.split("{", 1)
                selector = "{" + f'__name__="{name}", ' + rest
            for labels, _t, value in self._select(selector, at):
                key = json.dumps(labels, sort_keys=True)
                seen.setdefault(key, {"metric": labels, "value": [at, _fmt(value)]})
        return {"resultType": "vector", "result": list(seen.values())}

    def handler(self, request: httpx.Request) -> httpx.Response:
        if self.fail is not None:
            failed = self.fail(request)
            if failed is not None:
                return failed
        params = dict(request.url.params)
        expr = params.get("query", "")
        self.queries.append(expr)
        if expr.count("{") != expr.count("}"):
            return httpx.Response(
                400,
                json={
                    "status": "error",
                    "errorType": "bad_data",
                    "error": 'invalid parameter "query": 1:5: parse error: unexpected end of input',
                },
            )
        if request.url.path == "/api/v1/query":
            at = float(params.get("time", self.now))
            return httpx.Response(200, json={"status": "success", "data": self._instant(expr, at)})
        if request.url.path == "/api/v1/query_range":
            start, end, step = (float(params[k]) for k in ("start", "end", "step"))
            series: dict[str, dict[str, Any]] = {}
            t = start
            while t <= end + 1e-9:
                for item in self._instant(expr, t)["result"]:
                    key = json.dumps(item["metric"], sort_keys=True)
                    entry = series.setdefault(key, {"metric": item["metric"], "values": []})
                    entry["values"].append(item["value"])
                t += step
            data = {"resultType": "matrix", "result": list(series.values())}
            return httpx.Response(200, json={"status": "success", "data": data})
        return httpx.Response(404, text="404 page not found")

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url="http://prometheus.test:9090", transport=httpx.MockTransport(self.handler)
        )
