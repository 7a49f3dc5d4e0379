"""Read-only client for SGLang's HTTP API (both endpoint dialects), on httpx.

Paths live in one place (`PATHS`), because SGLang renamed them in 0.5.10 (`/get_server_info` ->
`/server_info`, `/get_model_info` -> `/model_info`, `/get_load` -> `/v1/loads`), added `/ready` in
0.5.20 and removed the old load path in 0.5.21 (read in the released wheels'
`entrypoints/http_server.py`). The client tries the new name first and falls back on 404, then
remembers which dialect answered.

Only idempotent GETs are retried (tenacity), and only on transport errors and 502/503/504. A 401 is
"unauthorised", a 404 on every info path is "not SGLang", a 404 on `/metrics` means the server runs
without `--enable-metrics` (the caller falls back on loads and server info and says so).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import httpx

from playbooks.engines import completions
from playbooks.engines.base import (
    Engine,
    EngineError,
    Metrics,
    Snapshot,
    Unauthorized,
    Unreachable,
    WrongEngine,
)
from playbooks.engines.kit import engine as kit
from playbooks.engines.sglang.series import SPEC
from playbooks.engines.timebudget import MOMENTS, StepCounters

PATHS = {
    "server_info": ("/server_info", "/get_server_info"),
    "model_info": ("/model_info", "/get_model_info"),
    "loads": ("/v1/loads", "/get_load"),
    # `/ready` since 0.5.20 (entrypoints/http_server.py `ready`: tokenizer_manager.is_ready(),
    # no generation); `/health` before, which runs a one-token generation on an idle server.
    "ready": ("/ready", "/health"),
    # the OpenAI-compatible completions, where the answer quality check asks its prompts
    # (`generate`; one path per prompt kind, no fallback between them)
    "completions": completions.PATHS,
}
SGLangError = EngineError  # the errors below are the engine seam's own
T = TypeVar("T")


class NotSGLang(WrongEngine):
    """Something answered that is not SGLang (or an SGLang older than kvpilot knows)."""


@dataclass(frozen=True)
class MemoryReport:
    """`internal_states[0].memory_usage`: GB per GPU as SGLang reports them (GiB in fact)."""

    weight_gb: float | None
    kvcache_gb: float | None
    graph_gb: float | None
    token_capacity: int | None
    startup_available_gb: float | None
    # The sliding-window pool's tokens on a hybrid SWA model; None (SGLang's null) otherwise
    # (0.5.23 `managers/scheduler_components/memory_usage.py`, from the scheduler's
    # `swa_tokens_per_layer` in `internal_state.py`).
    token_capacity_swa: int | None = None
    # The prefill CUDA graph's share of `graph_gb` where SGLang reports graphs per phase
    # (0.5.16 on); 0.0 where it captured none.
    prefill_graph_gb: float | None = None


@dataclass(frozen=True)
class ServerInfo:
    version: str
    max_total_num_tokens: int
    max_req_input_len: int | None
    server_args: dict[str, Any]
    memory: MemoryReport
    effective_max_running_requests: int | None
    dp_ranks: int
    raw: dict[str, Any] = field(repr=False)

    def arg(self, name: str, default: Any = None) -> Any:
        return self.server_args.get(name, default)

    @property
    def mem_fraction_static(self) -> float | None:
        value = self.server_args.get("mem_fraction_static")
        return float(value) if isinstance(value, (int, float)) else None

    @property
    def tp_size(self) -> int:
        return int(self.server_args.get("tp_size") or 1)

    @property
    def capacity_tokens(self) -> int:
        return self.max_total_num_tokens

    @property
    def model(self) -> str:
        return str(self.server_args.get("model_path") or "unknown")

    @property
    def settings(self) -> Mapping[str, Any]:
        return self.server_args


@dataclass(frozen=True)
class RankLoad:
    dp_rank: int
    running: int
    waiting: int
    used_tokens: int | None
    token_usage: float | None
    gen_throughput: float | None
    cache_hit_rate: float | None
    max_total_num_tokens: int | None
    steps: StepCounters | None = None  # 0.5.23's step accounting, where the server reports it


STEP_READ_FAILURES = 3  # load reports in a row that fail before step accounting is not asked


class SGLangClient(kit.EngineReader):
    """Reads SGLang state. Never mutates the server."""

    def __init__(
        self, http: httpx.Client, *, attempts: int = 3, wait: Callable[..., float] | None = None
    ) -> None:
        super().__init__(http, attempts=attempts, wait=wait)
        self._dialect: dict[str, str] = {}
        self._reports_steps = True  # until a load report without step accounting says not
        self._step_failures = 0  # load reports in a row that could not be read

    @classmethod
    def connect(cls, url: str, options: kit.ConnectOptions = kit.ASKED_NOTHING) -> SGLangClient:
        http = kit.engine_http(url, options, "http://127.0.0.1:30000")
        return cls(http, attempts=options.attempts, wait=options.wait)

    @property
    def engine(self) -> Engine:
        from playbooks.engines.sglang import ENGINE  # noqa: PLC0415 - the package imports us

        return ENGINE

    # ----------------------------------------------------------------- transport
    def _get(self, path: str, params: dict[str, str] | None = None) -> httpx.Response:
        response = super()._get(path, params)
        if response.status_code == 401:
            raise Unauthorized(
                f"{self.base_url} refused the request as unauthorised (401)",
                "The server runs with --api-key: configure the same key for this server.",
            )
        return response

    def _json(self, kind: str) -> Any:
        paths = PATHS[kind]
        order = [self._dialect[kind]] if kind in self._dialect else list(paths)
        last: httpx.Response | None = None
        for path in order:
            response = self._get(path)
            if response.status_code == 404:
                last = response
                continue
            if response.status_code != 200:
                raise SGLangError(
                    f"{self.base_url}{path} answered HTTP {response.status_code}",
                    "The server may be starting or overloaded; try again shortly.",
                )
            try:
                data = response.json()
            except ValueError:
                raise NotSGLang(
                    f"{self.base_url}{path} did not return JSON",
                    "Is this an SGLang server? Check the URL and port.",
                ) from None
            self._dialect[kind] = path
            return data
        assert last is not None
        raise NotSGLang(
            f"{self.base_url} has none of {', '.join(paths)}",
            "This does not look like an SGLang server (or it is older than 0.5.5).",
        )

    def _read(self, what: str, parse: Callable[[Any], T], raw: Any) -> T:
        """`parse(raw)`, with whatever a malformed answer breaks in it said as NotSGLang:
        a field of the wrong type, a NaN where a count belongs (tests/fuzz found each)."""
        try:
            return parse(raw)
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as e:
            raise NotSGLang(
                f"{self.base_url} answered a {what} kvpilot cannot read "
                f"({e.__class__.__name__}: {str(e)[:200]})",
                "Is this the SGLang version kvpilot supports? Its log may say more.",
            ) from None

    # ----------------------------------------------------------------- reads
    def health(self) -> bool:
        """Ready for requests: `/ready` where the server has it, `/health` on older ones."""
        paths = PATHS["ready"]
        order = [self._dialect["ready"]] if "ready" in self._dialect else list(paths)
        try:
            for path in order:
                status = self._get(path).status_code
                if status != 404:
                    self._dialect["ready"] = path
                    return status == 200
        except Unreachable:
            return False
        return False

    def server_info(self) -> ServerInfo:
        data = self._json("server_info")
        if not isinstance(data, dict) or "max_total_num_tokens" not in data:
            raise NotSGLang(
                f"{self.base_url} server info has no max_total_num_tokens",
                "This does not look like an SGLang server.",
            )
        return self._read("server info", parse_server_info, data)

    def model_info(self) -> dict[str, Any]:
        data = self._json("model_info")
        if not isinstance(data, dict):
            raise NotSGLang(f"{self.base_url} model info is not an object")
        return data

    def loads(self) -> list[RankLoad]:
        return self._read("load report", parse_loads, self._json("loads"))

    def metrics(self) -> Metrics:
        response = self._exposition(
            "/metrics", "Start SGLang with --enable-metrics for throughput counters."
        )
        if response.status_code != 200:
            raise SGLangError(f"{self.base_url}/metrics answered HTTP {response.status_code}")
        return self._read("/metrics", parse_metrics, response.text)

    def settings(self) -> ServerInfo:
        return self.server_info()

    def snapshot(self) -> Snapshot:
        return replace(self.snapshot_of(self.metrics()), steps=self.step_counters())

    def step_counters(self) -> StepCounters | None:
        """The schedulers' step accounting from the load report, which `/metrics` lacks
        (`timebudget`). Best effort: a reading without it loses only the throughput model's
        evidence, so a failed read is None, and a server whose report has no such fields
        (before 0.5.23, or no load endpoint), or that failed three times in a row, is not asked
        again: a stuck endpoint must not slow every scrape."""
        if not self._reports_steps:
            return None
        try:
            loads = self.loads()
        except NotSGLang:
            self._reports_steps = False
            return None
        except EngineError:
            self._step_failures += 1
            self._reports_steps = self._step_failures < STEP_READ_FAILURES
            return None
        self._step_failures = 0
        if not loads or any(x.steps is None for x in loads):
            self._reports_steps = False
            return None
        return StepCounters.of_ranks([x.steps for x in loads if x.steps is not None])

    def snapshot_of(self, metrics: Metrics) -> Snapshot:
        from playbooks.engines.sglang.metrics import snapshot_from_metrics  # noqa: PLC0415

        return self._read("/metrics", snapshot_from_metrics, metrics)

    def load_snapshot(self) -> Snapshot:
        from playbooks.engines.sglang.metrics import snapshot_from_loads  # noqa: PLC0415

        return self._read("load report", snapshot_from_loads, self.loads())

    def describe_metrics(self) -> str:
        return f"{self.base_url}/metrics (scraped directly)"

    @property
    def dialect(self) -> str:
        """`0.5.10+` or `0.5.5`, once server info has been read."""
        return "0.5.5" if self._dialect.get("server_info") == "/get_server_info" else "0.5.10+"


# What a stored copy of server info leaves out: secrets, and values that change on every start.
_SECRET_SUFFIXES = ("_key", "_token", "_secret", "_password")
_VOLATILE_KEYS = frozenset({"kvpilot_twin", "startup_time", "launch_command"})
_KEPT_STATE_KEYS = ("memory_usage", "effective_max_running_requests_per_dp")
# The settings a report shows for the configuration now (`server_info` keys).
KEY_SETTINGS = (
    "version",
    "model_path",
    "tp_size",
    "dp_size",
    "mem_fraction_static",
    "max_total_num_tokens",
    "max_running_requests",
    "chunked_prefill_size",
    "kv_cache_dtype",
    "schedule_conservativeness",
    "schedule_policy",
    "enable_hierarchical_cache",
    "hicache_size",
    "hicache_ratio",
    "page_size",
    "context_length",
)
NOT_COMPARED = frozenset({"internal_states"})  # per-rank state: not a setting


def stored_settings(info: Mapping[str, Any]) -> dict[str, Any]:
    """What to keep of server info: its settings, without secrets or moving values (`api_key`,
    `launch_command` with its `--api-key`, start-up times), and of the per-rank state only the
    memory report that capacity arithmetic reads back."""
    out: dict[str, Any] = {}
    for key, value in info.items():
        if key in _VOLATILE_KEYS or key == "api_key" or key.endswith(_SECRET_SUFFIXES):
            continue
        if key == "internal_states":
            states = value if isinstance(value, list) else []
            first = states[0] if states and isinstance(states[0], dict) else {}
            kept = {k: first[k] for k in _KEPT_STATE_KEYS if k in first}
            out[key] = [kept] * max(1, len(states))
            continue
        if isinstance(value, (str, int, float, bool)) or value is None:
            out[key] = value
    return out


def parse_server_info(data: dict[str, Any]) -> ServerInfo:
    states = data.get("internal_states") or [{}]
    first = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    usage = first.get("memory_usage") or {}
    graph = usage.get("graph", usage.get("cuda_graph"))
    prefill_graph = None
    if isinstance(graph, dict):  # 0.5.16 on report graph memory per phase
        prefill_graph = graph.get("prefill")
        graph = sum(v for v in graph.values() if isinstance(v, (int, float)))
    effective = first.get("effective_max_running_requests_per_dp")
    server_args = {k: v for k, v in data.items() if k not in ("internal_states",)}
    return ServerInfo(
        version=str(data.get("version", "unknown")),
        max_total_num_tokens=int(data["max_total_num_tokens"]),
        max_req_input_len=_int(data.get("max_req_input_len")),
        server_args=server_args,
        memory=MemoryReport(
            weight_gb=_float(usage.get("weight")),
            kvcache_gb=_float(usage.get("kvcache")),
            graph_gb=_float(graph),
            token_capacity=_int(usage.get("token_capacity")),
            startup_available_gb=_float(usage.get("startup_available")),
            token_capacity_swa=_int(usage.get("token_capacity_swa")),
            prefill_graph_gb=_float(prefill_graph),
        ),
        effective_max_running_requests=_int(effective),
        dp_ranks=len(states) if isinstance(states, list) and states else 1,
        raw=data,
    )


def parse_loads(data: Any) -> list[RankLoad]:
    """`/v1/loads` (0.5.10+) or `/get_load` (0.5.5) into per-rank loads."""
    if isinstance(data, dict) and isinstance(data.get("loads"), list):
        return [
            RankLoad(
                dp_rank=int(x.get("dp_rank", i)),
                running=int(x.get("num_running_reqs", 0)),
                waiting=int(x.get("num_waiting_reqs", 0)),
                used_tokens=_int(x.get("num_used_tokens")),
                token_usage=_float(x.get("token_usage")),
                gen_throughput=_float(x.get("gen_throughput")),
                cache_hit_rate=_float(x.get("cache_hit_rate")),
                max_total_num_tokens=_int(x.get("max_total_num_tokens")),
                steps=_steps(x),
            )
            for i, x in enumerate(data["loads"])
        ]
    if isinstance(data, list):
        return [
            RankLoad(
                dp_rank=int(x.get("dp_rank", i)),
                running=int(x.get("num_reqs", 0)) - int(x.get("num_waiting_reqs", 0)),
                waiting=int(x.get("num_waiting_reqs", 0)),
                used_tokens=_int(x.get("num_tokens")),
                token_usage=None,
                gen_throughput=None,
                cache_hit_rate=None,
                max_total_num_tokens=None,
            )
            for i, x in enumerate(data)
        ]
    raise NotSGLang("the load endpoint returned an unexpected shape")


def parse_metrics(text: str) -> Metrics:
    """Every `sglang:` sample with its label set; how label sets combine is `metrics.py`'s."""
    return kit.read_metrics(text, SPEC, NotSGLang)


def _steps(load: dict[str, Any]) -> StepCounters | None:
    """A rank's prefill busy time and decode moments (`scheduler.py::_accumulate_decode_moment`:
    steps, sum of batch sizes, of step microseconds, of batch squared, of batch times
    microseconds, of tokens generated), step times in seconds. None where the report has no
    step accounting; all zeros before the first decode step (the moments are then null)."""
    if "total_prefill_busy_us" not in load:
        return None
    raw, busy = load.get("decode_moments"), load["total_prefill_busy_us"]
    if raw is None:
        raw = [0.0] * MOMENTS
    numbers = [busy, *raw[:MOMENTS]] if isinstance(raw, list) and len(raw) >= MOMENTS else []
    try:
        values = [float(v) for v in numbers if isinstance(v, (int, float))]
    except OverflowError:  # an integer too large for a float
        values = []
    if len(values) != 1 + MOMENTS or any(isinstance(v, bool) for v in numbers):
        return None  # not accounting kvpilot can read: the model does without it
    if not all(math.isfinite(v) and v >= 0 for v in values):
        return None
    prefill_s, n, sb, st, sbb, sbt = values
    prefill_s /= 1e6
    return StepCounters(prefill_s, (n, sb, st / 1e6, sbb, sbt / 1e6))


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
