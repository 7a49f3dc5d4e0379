"""An engine's metrics (and DCGM GPU memory) from Prometheus' HTTP API instead of the server.

This module is where metrics come from, not what they mean: which series are the engine's is
the engine's `MetricsSpec` (a name prefix, the one histogram kept, a heartbeat gauge), and what
they mean is `Engine.snapshot`. Prometheus scrapes the server's metrics endpoint and keeps every
sample with its labels, so the newest sample of each of the engine's series is the scrape
kvpilot would have made itself, at most one Prometheus scrape interval old.
`PrometheusMetrics.metrics()` asks for exactly those series with one instant query and sums them
the way a direct scrape is summed, so measurement, diagnosis and the gate see the same structure:

    {__name__=~"PREFIX.+", __name__!~"PREFIX.+_bucket", SELECTOR}
      or {__name__="TTFT_HISTOGRAM", SELECTOR}

(every series of the engine except histogram buckets, plus the TTFT buckets the gate's guardrail
reads). A second query, `max(timestamp(HEARTBEAT SELECTOR))`, says how old the newest
scrape is; data older than `max_age_s` is refused rather than measured. A failed scrape makes
Prometheus mark every series stale until the next one succeeds; then the newest complete scrape
of the last `max_age_s` seconds is read from the raw samples instead, so one slow scrape does not
interrupt a measurement.

For windows in the past, `series()` returns the same structure for every step of a range query
(`/api/v1/query_range`), and `scrapes()` every scrape Prometheus stored, each at its own
timestamp (a range selector `{...}[Nms]`), which is what rates need.

`DcgmGpuReader` reads GPU memory from DCGM exporter series (`DCGM_FI_DEV_FB_USED` +
`DCGM_FI_DEV_FB_FREE` [+ `DCGM_FI_DEV_FB_RESERVED`], MiB) when they exist.

Clocks: Prometheus stamps samples with wall-clock Unix time; the playbooks measure on their own
`Clock` (which runs `time_scale` times faster against an accelerated twin). `Timeline` maps a
Prometheus timestamp onto a playbook clock, so rates from windows read back from Prometheus are
computed on the same time base as rates from direct scrapes.

Errors name the Prometheus URL and the query, and say what to check.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from playbooks.clock import Clock
from playbooks.engines.base import EngineError, Metrics, MetricsSpec
from playbooks.http import http_client, http_retrying, is_http_url, retried_get
from playbooks.sources.gpu import MIB, GpuState, GpuUnavailable

MAX_RANGE_POINTS = 11_000  # Prometheus refuses range queries with more points per series
DEFAULT_MAX_AGE_S = 30.0
_MATCHER = re.compile(
    r"""\s*[A-Za-z_][A-Za-z0-9_]*\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)\s*"""
)
_HISTOGRAM_PARTS = ("_bucket", "_count", "_sum")


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


class PrometheusAPI:
    """Instant and range queries on Prometheus' HTTP API (`/api/v1/query`, `/query_range`)."""

    def __init__(
        self,
        http: httpx.Client,
        *,
        attempts: int = 3,
        wait: Callable[..., float] | None = None,
    ) -> None:
        self.http = http
        self._retry = http_retrying(attempts, wait)

    @classmethod
    def connect(
        cls, url: str, *, timeout: float = 10.0, bearer_token: str | None = None
    ) -> PrometheusAPI:
        if not is_http_url(url):
            raise PrometheusError(
                f"invalid Prometheus URL {url!r}",
                "Use the form http://HOST:PORT (for example http://127.0.0.1:9090).",
            )
        return cls(http_client(url, bearer_token=bearer_token, timeout_s=timeout))

    @property
    def base_url(self) -> str:
        return str(self.http.base_url).rstrip("/")

    def close(self) -> None:
        self.http.close()

    def query(self, expr: str, at: float | None = None) -> list[Series]:
        """An instant query: a vector (one entry per series), a scalar (one entry), or, for a
        range selector such as `x[5m]`, a matrix flattened to one entry per raw sample."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._call("/api/v1/query", params, expr)
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
    def _call(self, path: str, params: dict[str, str], expr: str) -> dict[str, Any]:
        try:
            response = retried_get(self.http, self._retry, path, params)
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


# ----------------------------------------------------------------------------- engine metrics
def _family(name: str, names: set[str]) -> str:
    """The metric family a sample name belongs to, as `parse_metrics` names it."""
    if name.endswith("_total"):
        return name[: -len("_total")]
    for part in _HISTOGRAM_PARTS:
        if name.endswith(part):
            base = name[: -len(part)]
            if f"{base}_bucket" in names or {f"{base}_sum", f"{base}_count"} <= names:
                return base
    return name


def metrics_from_series(series: Iterable[Series], spec: MetricsSpec) -> Metrics:
    """Sum the engine's series over their label sets, exactly as a direct scrape is summed."""
    items = [s for s in series if s.labels.get("__name__", "").startswith(spec.prefix)]
    names = {s.labels["__name__"] for s in items}
    samples: dict[str, float] = {}
    counts: dict[str, int] = {}
    families: set[str] = set()
    ttft: dict[float, float] = {}
    for s in items:
        name = s.labels["__name__"]
        families.add(_family(name, names))
        if name == spec.ttft_histogram and "le" in s.labels:
            le = float(s.labels["le"])
            ttft[le] = ttft.get(le, 0.0) + s.value
        if name.endswith("_created") or "le" in s.labels or math.isnan(s.value):
            continue
        samples[name] = samples.get(name, 0.0) + s.value
        counts[name] = counts.get(name, 0) + 1
    return Metrics(samples, counts, frozenset(families), ttft)


@dataclass(frozen=True)
class Reading:
    metrics: Metrics
    sampled_at: float  # Unix seconds of the newest sample (Prometheus' scrape)
    age_s: float  # how old that sample was when asked, on Prometheus' clock


class PrometheusMetrics:
    """A server's engine metrics as Prometheus last scraped them (a `MetricsSource`)."""

    def __init__(
        self,
        api: PrometheusAPI,
        selector: str,
        spec: MetricsSpec,
        *,
        max_age_s: float = DEFAULT_MAX_AGE_S,
    ) -> None:
        try:
            self.matchers = parse_selector(selector)
        except ValueError as exc:
            raise PrometheusError(str(exc)) from None
        if not max_age_s > 0:
            raise ValueError(f"max_age_s must be positive, got {max_age_s}")
        self.api = api
        self.spec = spec
        self.selector = "{" + self.matchers + "}"
        self.max_age_s = max_age_s

    def describe(self) -> str:
        return f"Prometheus at {self.api.base_url}, series {self.selector}"

    @property
    def expression(self) -> str:
        return f"{self._series(self.matchers)} or {self._histogram(self.matchers)}"

    def _series(self, matchers: str, window: str = "") -> str:
        prefix = re.escape(self.spec.prefix)
        return f'{{__name__=~"{prefix}.+", __name__!~"{prefix}.+_bucket", {matchers}}}{window}'

    def _histogram(self, matchers: str, window: str = "") -> str:
        return f'{{__name__="{self.spec.ttft_histogram}", {matchers}}}{window}'

    @property
    def freshness_expression(self) -> str:
        # timestamp() drops the metric name, so it must read one metric: the engine's
        # heartbeat gauge, present in every version and refreshed every scrape.
        return f"max(timestamp({self.spec.heartbeat}{{{self.matchers}}}))"

    def reading(self) -> Reading:
        series = self.api.query(self.expression)
        if not series:
            # A failed scrape (a timeout, the server busy) marks every series stale until the
            # next one succeeds, so an instant query finds nothing; the last good scrape still
            # counts if it is recent enough.
            return self._last_good_scrape()
        self._check_one_target(series, self.expression)
        fresh = self.api.query(self.freshness_expression)
        if not fresh or math.isnan(fresh[0].value):
            return self._last_good_scrape()  # a scrape failed between the two queries
        sampled_at, evaluated_at = fresh[0].value, fresh[0].t
        age = max(0.0, evaluated_at - sampled_at)
        if age > self.max_age_s:
            raise self._stale(age, self.freshness_expression)
        return Reading(metrics_from_series(series, self.spec), sampled_at, age)

    def _last_good_scrape(self) -> Reading:
        now = self.api.now()
        try:
            recent = self.scrapes(now - self.max_age_s, now)
        except NoSeries:
            recent = []
        if recent:
            sampled_at, metrics = recent[-1]
            return Reading(metrics, sampled_at, max(0.0, now - sampled_at))
        # Nothing recent: say how old the newest sample is, if there is one at all.
        window = f"[{math.ceil(10 * self.max_age_s)}s]"
        expr = f"{self.spec.heartbeat}{self.selector}{window}"
        older = self.api.query(expr, at=now)
        if older:
            raise self._stale(now - max(s.t for s in older), expr)
        raise self._no_series(self.expression)

    def _stale(self, age: float, expr: str) -> StaleSeries:
        return StaleSeries(
            f"the newest {self.spec.label} sample Prometheus at {self.api.base_url} has for "
            f"{self.selector} is {age:.0f} s old (limit {self.max_age_s:g} s; query: `{expr}`)",
            "Prometheus no longer scrapes this server: is the server up, and is it still a "
            "target (Status > Targets in Prometheus' UI)? If Prometheus scrapes it less often "
            "than every max_age_s seconds, raise servers.NAME.metrics.max_age_s.",
            query=expr,
        )

    def metrics(self) -> Metrics:
        return self.reading().metrics

    def series(self, start: float, end: float, step: float) -> list[tuple[float, Metrics]]:
        """The metrics at every `step` seconds from `start` to `end` (Unix seconds): at each
        step, the newest scrape at or before it (a range query)."""
        points = self.api.query_range(self.expression, start, end, step)
        return self._by_time(points, self.expression, start, end)

    def scrapes(self, start: float, end: float) -> list[tuple[float, Metrics]]:
        """Every scrape Prometheus stored from `start` to `end` (Unix seconds), each at its
        own timestamp: exact for rates, whatever Prometheus' scrape interval."""
        if end <= start:
            raise ValueError(f"the window ends ({end}) before it starts ({start})")
        window = f"[{math.ceil((end - start) * 1000)}ms]"
        exprs = (
            self._series(self.matchers, window),
            self._histogram(self.matchers, window),
        )
        points = [p for expr in exprs for p in self.api.query(expr, at=end)]
        return self._by_time(points, exprs[0], start, end)

    def _by_time(
        self, points: list[Series], expr: str, start: float, end: float
    ) -> list[tuple[float, Metrics]]:
        if not points:
            raise self._no_series(expr, f" between {start:.3f} and {end:.3f} (Unix time)")
        self._check_one_target(points, expr)
        by_time: dict[float, list[Series]] = {}
        for p in points:
            by_time.setdefault(p.t, []).append(p)
        return [(t, metrics_from_series(by_time[t], self.spec)) for t in sorted(by_time)]

    def _no_series(self, expr: str, when: str = "") -> NoSeries:
        return NoSeries(
            f"Prometheus at {self.api.base_url} has no {self.spec.label} series for "
            f"{self.selector}{when} (query: `{expr}`)",
            f"Check that Prometheus scrapes this server ({self.spec.how_to_enable}) and "
            "that the selector's labels match what Prometheus stores: query "
            f'{{__name__="{self.spec.heartbeat}"}} in its UI to see them.',
            query=expr,
        )

    def _check_one_target(self, series: list[Series], expr: str) -> None:
        targets = sorted({(s.labels.get("job", ""), s.labels.get("instance", "")) for s in series})
        if len(targets) > 1:
            shown = ", ".join(f'job="{j}" instance="{i}"' for j, i in targets[:4])
            raise AmbiguousSelector(
                f"the selector {self.selector} matches {len(targets)} scrape targets in "
                f"Prometheus at {self.api.base_url} ({shown}; query: `{expr}`)",
                "Narrow it to this one server, e.g. with its instance label.",
                query=expr,
            )


@dataclass(frozen=True)
class Timeline:
    """Maps Prometheus timestamps onto a playbook clock (which may run `scale` x wall time)."""

    prometheus_now: float
    clock_now: float
    scale: float

    @classmethod
    def capture(cls, api: PrometheusAPI, clock: Clock, scale: float = 1.0) -> Timeline:
        if not scale > 0:
            raise ValueError(f"time scale must be positive, got {scale}")
        before = clock.now()
        prometheus_now = api.now()
        after = clock.now()
        return cls(prometheus_now, (before + after) / 2, scale)

    def at(self, unix_s: float) -> float:
        """The clock's reading when Prometheus' clock read `unix_s`."""
        return self.clock_now - (self.prometheus_now - unix_s) * self.scale

    def unix(self, clock_s: float) -> float:
        """Prometheus' clock when the playbook clock read `clock_s`."""
        return self.prometheus_now - (self.clock_now - clock_s) / self.scale


# ----------------------------------------------------------------------------- DCGM
DCGM_USED = "DCGM_FI_DEV_FB_USED"
DCGM_FREE = "DCGM_FI_DEV_FB_FREE"
DCGM_RESERVED = "DCGM_FI_DEV_FB_RESERVED"


def _gpu_key(labels: dict[str, str]) -> tuple[str, str, str]:
    return (
        labels.get("Hostname", labels.get("instance", "")),
        labels.get("gpu", ""),
        labels.get("UUID", ""),
    )


class DcgmGpuReader:
    """GPU memory from DCGM exporter series in Prometheus (a `GpuReader`).

    DCGM reports frame-buffer memory in MiB: used, free and (on newer drivers) reserved, which
    add up to what `nvidia-smi` calls the total.
    """

    def __init__(self, api: PrometheusAPI, selector: str) -> None:
        try:
            self.matchers = parse_selector(selector)
        except ValueError as exc:
            raise PrometheusError(str(exc)) from None
        self.api = api
        self.selector = "{" + self.matchers + "}"

    def snapshot(self) -> list[GpuState]:
        try:
            used = self.api.query(f"{DCGM_USED}{self.selector}")
            free = self.api.query(f"{DCGM_FREE}{self.selector}")
            reserved = self.api.query(f"{DCGM_RESERVED}{self.selector}")
        except PrometheusError as exc:
            raise GpuUnavailable(f"DCGM metrics unavailable: {exc}") from None
        if not used or not free:
            missing = DCGM_USED if not used else DCGM_FREE
            raise GpuUnavailable(
                f"Prometheus at {self.api.base_url} has no {missing}{self.selector} series "
                "(is dcgm-exporter running and scraped, and does the DCGM selector match?)"
            )
        free_by = {_gpu_key(s.labels): s.value for s in free}
        reserved_by = {_gpu_key(s.labels): s.value for s in reserved}
        states: list[GpuState] = []
        for s in sorted(used, key=lambda x: (_gpu_key(x.labels), x.labels.get("gpu", ""))):
            key = _gpu_key(s.labels)
            if key not in free_by:
                raise GpuUnavailable(f"DCGM reports used but not free memory for GPU {key}")
            used_mib, free_mib = s.value, free_by[key]
            total_mib = used_mib + free_mib + reserved_by.get(key, 0.0)
            if any(math.isnan(v) or v < 0 for v in (used_mib, free_mib, total_mib)):
                raise GpuUnavailable(f"DCGM reports no valid frame-buffer sizes for GPU {key}")
            gpu = s.labels.get("gpu", "")
            states.append(
                GpuState(
                    index=int(gpu) if gpu.isdigit() else len(states),
                    name=s.labels.get("modelName", "unknown GPU"),
                    uuid=s.labels.get("UUID", ""),
                    memory_total_bytes=int(total_mib * MIB),
                    memory_used_bytes=int(used_mib * MIB),
                    memory_free_bytes=int(free_mib * MIB),
                    utilization_gpu_pct=None,
                    utilization_memory_pct=None,
                )
            )
        return states
