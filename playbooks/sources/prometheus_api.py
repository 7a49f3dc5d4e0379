"""Prometheus' HTTP API: instant and range queries, selectors, and what can go wrong.

The transport under `playbooks.sources.prometheus` (engine metrics) and
`playbooks.sources.dcgm` (GPU memory): it knows PromQL's answer shapes, not what the series
mean. Errors name the Prometheus URL and the query, and say what to check.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import httpx

from playbooks.engines.base import EngineError
from playbooks.http import Reader, http_client, require_http_url

MAX_RANGE_POINTS = 11_000  # Prometheus refuses range queries with more points per series
# A longer expression goes as POST form data: proxies and Prometheus' own HTTP server limit a
# request line to a few KiB, and a query for hundreds of servers names every one of them.
POST_OVER_CHARS = 2000
_MATCHER = re.compile(
    r"""\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)\s*"""
)


class PrometheusError(EngineError):
    """A problem reading metrics from Prometheus; the message names the query."""

    def __init__(self, message: str, hint: str = "", query: str = "") -> None:
        super().__init__(message, hint)
        self.query = query


class PrometheusUnreachable(PrometheusError):
    pass


class PrometheusQueryFailed(PrometheusError):
    pass


class NoSeries(PrometheusError):
    pass


class StaleSeries(PrometheusError):
    pass


class AmbiguousSelector(PrometheusError):
    pass


def parse_selector(text: str) -> str:
    """The label matchers inside a PromQL selector such as `{instance="10.0.0.5:30000"}`.

    Raises ValueError saying what is wrong; the result goes between the braces of a query.
    """
    stripped = text.strip()
    if not (stripped.startswith("{") and stripped.endswith("}")):
        raise ValueError(
            f"selector {text!r} must be label matchers in braces, e.g. "
            '{instance="10.0.0.5:30000"} or {job="sglang", instance=~"gpu-7:.*"}'
        )
    inner = stripped[1:-1].strip().rstrip(",").strip()
    if not inner:
        raise ValueError(
            f"selector {text!r} is empty: it would match every server Prometheus scrapes; "
            'name this one, e.g. {instance="10.0.0.5:30000"}'
        )
    pos = 0
    matchers: list[str] = []
    while pos < len(inner):
        found = _MATCHER.match(inner, pos)
        if found is None:
            raise ValueError(
                f"selector {text!r}: cannot read a label matcher at {inner[pos:]!r}; use "
                'label="value", label!="value", label=~"regex" or label!~"regex", '
                "separated by commas"
            )
        matchers.append(found.group(0).strip())
        pos = found.end()
        if pos < len(inner):
            if inner[pos] != ",":
                raise ValueError(
                    f"selector {text!r}: expected a comma after {found.group(0).strip()!r}"
                )
            pos += 1
    if any(m.startswith("__name__") for m in matchers):
        raise ValueError(
            f"selector {text!r}: leave out __name__; kvpilot chooses the metric names itself"
        )
    return ", ".join(matchers)


def label_matchers(matchers: str) -> list[tuple[str, str, str]]:
    """`parse_selector`'s result taken apart: (label, operator, value as written, quotes and
    all) for each matcher."""
    out = []
    pos = 0
    while pos < len(matchers):
        found = _MATCHER.match(matchers, pos)
        if found is None:
            raise ValueError(f"cannot read a label matcher at {matchers[pos:]!r}")
        out.append((found.group(1), found.group(2), found.group(3)))
        pos = found.end() + 1  # past the comma
    return out


def default_selector(server_url: str) -> str:
    """`{instance="HOST:PORT"}`: the label Prometheus gives a target it scrapes at that address."""
    url = httpx.URL(server_url)
    port = url.port or (443 if url.scheme == "https" else 80)
    return f'{{instance="{url.host}:{port}"}}'


# ----------------------------------------------------------------------------- the HTTP API
@dataclass(frozen=True)
class Series:
    """One series of an instant vector, or one of a range query's series at one step."""

    labels: dict[str, str]
    t: float  # Unix seconds
    value: float


def _float(text: Any) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def _flatten(matrix: list[Any]) -> list[Series]:
    out = []
    for item in matrix:
        labels = dict(item.get("metric", {}))
        for t, value in item.get("values", []):
            out.append(Series(labels, _float(t), _float(value)))
    return out


class PrometheusAPI(Reader):
    """Instant and range queries on Prometheus' HTTP API (`/api/v1/query`, `/query_range`)."""

    @classmethod
    def connect(
        cls, url: str, *, timeout: float = 10.0, bearer_token: str | None = None
    ) -> PrometheusAPI:
        require_http_url(url, "Prometheus", "http://127.0.0.1:9090", PrometheusError)
        return cls(http_client(url, bearer_token=bearer_token, timeout_s=timeout))

    def query(self, expr: str, at: float | None = None) -> list[Series]:
        """An instant query: a vector (one entry per series), a scalar (one entry), or, for a
        range selector such as `x[5m]`, a matrix flattened to one entry per raw sample. A long
        expression (over `POST_OVER_CHARS`) is sent as form data, which Prometheus accepts too."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._call("/api/v1/query", params, expr, post=len(expr) > POST_OVER_CHARS)
        kind, result = data.get("resultType"), data.get("result")
        if kind == "scalar" and isinstance(result, list) and len(result) == 2:
            return [Series({}, _float(result[0]), _float(result[1]))]
        if kind == "matrix" and isinstance(result, list):
            return _flatten(result)
        if kind != "vector" or not isinstance(result, list):
            raise PrometheusQueryFailed(
                f"Prometheus at {self.base_url} answered the query `{expr}` with a {kind} "
                "where a vector was expected",
                query=expr,
            )
        out = []
        for item in result:
            labels, value = item.get("metric", {}), item.get("value", [math.nan, "NaN"])
            out.append(Series(dict(labels), _float(value[0]), _float(value[1])))
        return out

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        """A range query, flattened: one entry per series per step that has a value."""
        if not step > 0:
            raise ValueError(f"the step of a range query must be positive, got {step}")
        if end < start:
            raise ValueError(f"the range query ends ({end}) before it starts ({start})")
        points = int((end - start) / step) + 1
        if points > MAX_RANGE_POINTS:
            raise ValueError(
                f"a range of {end - start:.0f} s at a {step:g} s step is {points} points per "
                f"series; Prometheus allows {MAX_RANGE_POINTS}: use a longer step"
            )
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step}"}
        data = self._call("/api/v1/query_range", params, expr)
        if data.get("resultType") != "matrix" or not isinstance(data.get("result"), list):
            raise PrometheusQueryFailed(
                f"Prometheus at {self.base_url} answered the range query `{expr}` with a "
                f"{data.get('resultType')} where a matrix was expected",
                query=expr,
            )
        return _flatten(data["result"])

    def now(self) -> float:
        """Prometheus' own clock (Unix seconds), to judge sample ages without clock skew."""
        (point,) = self.query("time()")
        return point.value

    # ----------------------------------------------------------------- transport
    def _call(
        self, path: str, params: dict[str, str], expr: str, *, post: bool = False
    ) -> dict[str, Any]:
        try:
            if post:
                response = self._retried_read_post(path, params)
            else:
                response = self._retried_get(path, params)
        except httpx.TransportError as exc:
            raise PrometheusUnreachable(
                f"cannot reach Prometheus at {self.base_url} for the query `{expr}`: "
                f"{exc.__class__.__name__}: {exc}",
                "Is Prometheus running, and is servers.NAME.metrics.url right?",
                query=expr,
            ) from exc
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            hint = (
                "Is this URL Prometheus itself (not Grafana, a Pushgateway or an exporter)?"
                if response.status_code in (200, 404)
                else "Prometheus may be overloaded or restarting; try again shortly."
            )
            raise PrometheusQueryFailed(
                f"{self.base_url}{path} answered HTTP {response.status_code} without Prometheus' "
                f"JSON for the query `{expr}`",
                hint,
                query=expr,
            )
        if body.get("status") != "success" or response.status_code != 200:
            kind = body.get("errorType", f"HTTP {response.status_code}")
            raise PrometheusQueryFailed(
                f"Prometheus at {self.base_url} refused the query `{expr}`: {kind}: "
                f"{body.get('error', 'no reason given')}",
                "Check the selector (servers.NAME.metrics.selector) for PromQL syntax."
                if kind == "bad_data"
                else "Prometheus may be overloaded; try again shortly.",
                query=expr,
            )
        data = body.get("data")
        if not isinstance(data, dict):
            raise PrometheusQueryFailed(
                f"Prometheus at {self.base_url} returned no data for the query `{expr}`",
                query=expr,
            )
        return data
