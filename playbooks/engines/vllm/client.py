"""Read-only client for vLLM's HTTP API (the OpenAI-compatible server), on httpx.

What a vLLM server says about itself, and where (vLLM 0.32, `vllm/entrypoints/serve/`):

* `GET /version` answers `{"version": "0.32.0"}`: how kvpilot tells a vLLM server, together with
  its `vllm:` metric families (or, with metrics off, `/v1/models` entries `owned_by` vLLM).
* `GET /metrics` always answers; its `vllm:cache_config_info` gauge carries the whole
  CacheConfig as labels (block size, utilization, KV dtype, blocks, the KV bytes flag, offload
  size): the only live source of the KV settings and capacity on a standard server.
* `GET /v1/models` gives the served name, the model path (`root`) and `max_model_len`.
* `GET /server_info` exists only with `VLLM_SERVER_DEV_MODE=1`; it has the scheduler and
  parallel settings (`max_num_seqs`, `max_num_batched_tokens`, TP, DP) that nothing else exports.
  Without it those come from the launch arguments, where kvpilot knows them.
* `GET /health` is 200 once the engine serves and 503 once it has died.

`--api-key` guards only paths under `/v1`, `/v2`, `/inference` and `/cohere`
(`serve/middleware/authenticate.py`): `/metrics`, `/health`, `/version` and `/server_info` stay
readable without the key. So a 401 on `/v1/models` says only that kvpilot lacks the key: the
model's length is then unknown and said so, not a failure to read the server.

Only idempotent GETs are retried (tenacity), on transport errors and 502/503/504.

Why it is long: vLLM states its settings in four places (metrics labels, `/v1/models`, both
formats of `/server_info`, the launch arguments) and each reading is kept beside the assembly
that ranks them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from playbooks.engines import completions
from playbooks.engines.base import (
    Engine,
    EngineError,
    LaunchArgs,
    Metrics,
    MetricsDisabled,
    Snapshot,
    Unauthorized,
    Unreachable,
    WrongEngine,
)
from playbooks.engines.kit import engine as kit
from playbooks.engines.vllm import metrics as _m
from playbooks.engines.vllm.allow_list import launch_settings, speculative_settings

VERSION = "/version"
MODELS = "/v1/models"
METRICS = "/metrics"
HEALTH = "/health"
SERVER_INFO = "/server_info"  # VLLM_SERVER_DEV_MODE=1 only
ENDPOINTS = (VERSION, MODELS, METRICS, HEALTH, SERVER_INFO, *completions.PATHS)
NOT_IN_METRICS = (
    "max_num_seqs, the token budget and the parallel sizes are unknown (vLLM reports them only "
    "with VLLM_SERVER_DEV_MODE=1)"
)
KEY_HINT = (
    "the server runs with --api-key, which guards its /v1 API: configure the same key for "
    "this server"
)


class NotVLLM(WrongEngine):
    """Something answered that is not vLLM (or a vLLM older than kvpilot knows)."""


@dataclass(frozen=True)
class VLLMSettings:
    """What kvpilot knows of a vLLM server's settings, by vLLM's argument names.

    Built from a flat dict (`raw`, also what is stored), so a stored copy reads back the same.
    `capacity_tokens` is 0 where nothing said it (metrics off, no dev mode).
    """

    version: str
    model: str
    capacity_tokens: int
    engines: int
    args: dict[str, Any]
    sources: tuple[str, ...]
    raw: dict[str, Any] = field(repr=False)
    notes: tuple[str, ...] = ()  # what could not be read, for the diagnosis's notes

    @property
    def settings(self) -> Mapping[str, Any]:
        return self.args

    def arg(self, name: str, default: Any = None) -> Any:
        value = self.args.get(name)
        return default if value is None else value

    @property
    def blocks_per_engine(self) -> int | None:
        value = self.raw.get("num_gpu_blocks")
        return value if isinstance(value, int) else None

    @property
    def utilization(self) -> float | None:
        value = self.args.get("gpu_memory_utilization")
        return float(value) if isinstance(value, (int, float)) else None

    @property
    def tp_size(self) -> int:
        return int(self.arg("tensor_parallel_size", 1))


# Flat keys: vLLM's argument names kvpilot keeps as settings, and the state beside them.
SETTING_KEYS = (
    "max_num_active_seqs",  # read, never edited: the admission cap where set
    "kv_connector",  # `--kv-transfer-config`'s connector and role: a disaggregated instance
    "kv_role",
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "kv_cache_dtype",
    "block_size",
    "enable_prefix_caching",
    "num_gpu_blocks_override",
    "kv_offloading_size",
    "kv_offloading_backend",
    "sliding_window",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_chunked_prefill",
    "enforce_eager",
    "max_cudagraph_capture_size",
    "tensor_parallel_size",
    "data_parallel_size",
    "speculative_method",  # the drafter, read to size its KV beside the target's
    "speculative_model",
    "num_speculative_tokens",
)
STATE_KEYS = ("num_gpu_blocks", "kv_cache_size_tokens", "capacity_tokens", "engines")
# The settings a report shows for the configuration now.
KEY_SETTINGS = (
    "version",
    "model",
    "tensor_parallel_size",
    "data_parallel_size",
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "capacity_tokens",
    "max_num_seqs",
    "max_num_batched_tokens",
    "kv_cache_dtype",
    "block_size",
    "max_model_len",
    "enable_prefix_caching",
    "enforce_eager",
    "max_cudagraph_capture_size",
    "kv_offloading_size",
)
NOT_COMPARED = frozenset({"settings_from", "settings_notes"})  # provenance, not a setting
_SECRET_SUFFIXES = ("_key", "_token", "_secret", "_password")


def parse_settings(raw: Mapping[str, Any]) -> VLLMSettings:
    """A flat settings dict (as the client assembles it, or as stored) read back."""
    data = dict(raw)
    sources = data.get("settings_from") or ()
    notes = data.get("settings_notes") or ()
    return VLLMSettings(
        version=str(data.get("version", "unknown")),
        model=str(data.get("model") or "unknown"),
        capacity_tokens=int(data.get("capacity_tokens") or 0),
        engines=int(data.get("engines") or 1),
        args={k: data[k] for k in SETTING_KEYS if data.get(k) is not None},
        sources=tuple(str(s) for s in sources),
        raw=data,
        notes=tuple(str(n) for n in notes),
    )


def stored_settings(raw: Mapping[str, Any]) -> dict[str, Any]:
    """What to keep of the settings: scalars and the list of sources, never a secret."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "api_key" or key.endswith(_SECRET_SUFFIXES):
            continue
        if isinstance(value, (str, int, float, bool)) or value is None:
            out[key] = value
        elif key in NOT_COMPARED and isinstance(value, (list, tuple)):
            out[key] = [str(v) for v in value]
    return out


# ----------------------------------------------------------------------------- the sources
def _value(text: str | None) -> Any:
    """A CacheConfig label's value as Python (labels are `str(value)`, None as "None")."""
    if text is None or text == "None":
        return None
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


# `vllm:cache_config_info` label -> kvpilot's key (vLLM's argument name)
CACHE_LABELS = {
    "gpu_memory_utilization": "gpu_memory_utilization",
    "kv_cache_memory_bytes": "kv_cache_memory_bytes",
    "cache_dtype": "kv_cache_dtype",
    "block_size": "block_size",
    "enable_prefix_caching": "enable_prefix_caching",
    "num_gpu_blocks_override": "num_gpu_blocks_override",
    "kv_offloading_size": "kv_offloading_size",
    "kv_offloading_backend": "kv_offloading_backend",
    "sliding_window": "sliding_window",
    "kv_cache_size_tokens": "kv_cache_size_tokens",
}


def from_metrics(m: Metrics) -> dict[str, Any]:
    """The cache settings, engines and capacity from one metrics reading."""
    configs = _m.cache_configs(m)
    if not configs:
        return {}
    labels = configs[0]
    out: dict[str, Any] = {key: _value(labels.get(label)) for label, key in CACHE_LABELS.items()}
    out.update(_pool(labels, max(1, len(configs))))
    return {k: v for k, v in out.items() if v is not None}


def _pool(labels: Mapping[str, str], engines: int) -> dict[str, Any]:
    """Engines, one engine's blocks and the usable capacity, from CacheConfig's fields."""
    out: dict[str, Any] = {"engines": engines}
    blocks = _value(labels.get("num_gpu_blocks"))
    if isinstance(blocks, int):
        out["num_gpu_blocks"] = blocks // engines  # the API process sums them over engines
    capacity = _m.capacity_tokens(labels, engines)
    if capacity is not None:
        out["capacity_tokens"] = capacity
    return out


def from_models(data: Any) -> dict[str, Any]:
    """The model path, served name and length from `/v1/models`."""
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries or not isinstance(entries[0], dict):
        return {}
    first = entries[0]
    out: dict[str, Any] = {"served_model_name": first.get("id"), "model": first.get("root")}
    if isinstance(first.get("max_model_len"), int):
        out["max_model_len"] = first["max_model_len"]
    return {k: v for k, v in out.items() if v is not None}


# /server_info's vllm_config section -> (kvpilot's key, the section's field)
SERVER_INFO_FIELDS: dict[str, tuple[tuple[str, str], ...]] = {
    "cache_config": (
        ("gpu_memory_utilization", "gpu_memory_utilization"),
        ("kv_cache_memory_bytes", "kv_cache_memory_bytes"),
        ("kv_cache_dtype", "cache_dtype"),
        ("block_size", "block_size"),
        ("enable_prefix_caching", "enable_prefix_caching"),
        ("kv_offloading_size", "kv_offloading_size"),
        ("kv_offloading_backend", "kv_offloading_backend"),
    ),
    "scheduler_config": (
        ("max_num_seqs", "max_num_seqs"),
        ("max_num_active_seqs", "max_num_active_seqs"),
        ("max_num_batched_tokens", "max_num_batched_tokens"),
        ("enable_chunked_prefill", "enable_chunked_prefill"),
    ),
    "model_config": (
        ("max_model_len", "max_model_len"),
        ("enforce_eager", "enforce_eager"),
        ("model", "model"),
    ),
    "parallel_config": (
        ("tensor_parallel_size", "tensor_parallel_size"),
        ("data_parallel_size", "data_parallel_size"),
    ),
    "compilation_config": (("max_cudagraph_capture_size", "max_cudagraph_capture_size"),),
}
# The text form (`VllmConfig.__str__`, `config_format=text`): `key=value, key=value, ...`.
TEXT_FIELDS = {
    "max_model_len": r"max_seq_len=(\d+)",
    "enforce_eager": r"enforce_eager=(True|False)",
    "tensor_parallel_size": r"tensor_parallel_size=(\d+)",
    "data_parallel_size": r"data_parallel_size=(\d+)",
    "kv_cache_dtype": r"kv_cache_dtype=([\w]+)",
}


def transfer_of(config: Any) -> dict[str, Any]:
    """`vllm_config.kv_transfer_config`'s connector and role, where the report has them."""
    transfer = config.get("kv_transfer_config") if isinstance(config, dict) else None
    if not isinstance(transfer, dict):
        return {}
    return {k: transfer[k] for k in ("kv_connector", "kv_role") if transfer.get(k)}


SPECULATIVE_TEXT = re.compile(
    r"speculative_config=SpeculativeConfig\(method='([\w-]+)', model=(?:'([^']*)'|None), "
    r"num_spec_tokens=(\d+)\)"
)


def speculative_of(config: Any) -> dict[str, Any]:
    """The drafter, from either format of `vllm_config` (`SpeculativeConfig.__repr__` in the
    text one); {} where speculative decoding is off."""
    if isinstance(config, dict):
        spec = config.get("speculative_config")
        return speculative_settings(spec) if isinstance(spec, dict) else {}
    match = SPECULATIVE_TEXT.search(config) if isinstance(config, str) else None
    if match is None:
        return {}
    method, model, tokens = match.groups()
    found = {"method": method, "model": model, "num_speculative_tokens": int(tokens)}
    return speculative_settings({k: v for k, v in found.items() if v})


def from_server_info(data: Any) -> dict[str, Any]:
    """The settings `/server_info` holds (dev mode), in either of its formats; with the JSON
    one also the blocks and capacity, the same way the metrics' cache config gives them."""
    config = data.get("vllm_config") if isinstance(data, dict) else None
    out: dict[str, Any] = {}
    out.update(transfer_of(config))
    out.update(speculative_of(config))
    if isinstance(config, dict):
        for section, pairs in SERVER_INFO_FIELDS.items():
            part = config.get(section)
            if not isinstance(part, dict):
                continue
            for key, name in pairs:
                if part.get(name) is not None:
                    out[key] = part[name]
        cache = config.get("cache_config")
        if isinstance(cache, dict):
            engines = int(out.get("data_parallel_size") or 1)
            labels = {k: str(v) for k, v in cache.items() if not isinstance(v, (dict, list))}
            out.update(_pool(labels, engines))
    elif isinstance(config, str):
        for key, pattern in TEXT_FIELDS.items():
            match = re.search(pattern, config)
            if match:
                out[key] = _value(match.group(1))
    return out


def assemble(
    version: str,
    metrics: Metrics | None,
    models: Any,
    server_info: Any,
    launch_args: Sequence[str] | None,
    notes: Sequence[str] = (),
) -> dict[str, Any]:
    """The flat settings, each key from the best source that has it: the server's dev-mode
    config, then its metrics and `/v1/models`, then the launch arguments kvpilot issued."""
    flat: dict[str, Any] = {"version": version}
    sources: list[str] = []
    layers = (
        ("launch arguments", launch_settings(launch_args) if launch_args else {}),
        (MODELS, from_models(models) if models is not None else {}),
        (METRICS, from_metrics(metrics) if metrics is not None else {}),
        (SERVER_INFO, from_server_info(server_info) if server_info is not None else {}),
    )
    for name, found in layers:  # later layers win
        if found:
            sources.append(name)
            flat.update(found)
    flat["settings_from"] = list(reversed(sources))
    if notes:
        flat["settings_notes"] = list(notes)
    return flat


# ----------------------------------------------------------------------------- the client
class VLLMClient(kit.EngineReader):
    """Reads vLLM state. Never mutates the server.

    Keeps its previous metrics reading, so each `snapshot()` carries the decode rate and the
    prefix-cache hit rate over the interval since the one before (vLLM exports counters only).
    """

    def __init__(
        self,
        http: httpx.Client,
        *,
        attempts: int = 3,
        wait: Callable[..., float] | None = None,
        launch_args: LaunchArgs = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(http, attempts=attempts, wait=wait)
        self._launch_args = launch_args
        self._clock = clock or time.monotonic
        self._history: list[_m.Timed] = []  # readings the next rates are taken against
        self._dev_mode: bool | None = None  # whether /server_info answers; None: not asked
        self.notes: list[str] = []

    @classmethod
    def connect(cls, url: str, options: kit.ConnectOptions = kit.ASKED_NOTHING) -> VLLMClient:
        http, o = kit.engine_http(url, options, "http://127.0.0.1:8000"), options
        return cls(http, attempts=o.attempts, wait=o.wait, launch_args=o.launch_args, clock=o.clock)

    @property
    def engine(self) -> Engine:
        from playbooks.engines.vllm import ENGINE  # noqa: PLC0415 - the package imports us

        return ENGINE

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    # ----------------------------------------------------------------- transport
    def _unauthorized(self, path: str) -> Unauthorized:
        return Unauthorized(
            f"{self.base_url}{path} refused the request as unauthorised (401)", KEY_HINT
        )

    def _json(self, path: str, params: dict[str, str] | None = None) -> Any:
        """A JSON answer; None on 404 (the server has no such path)."""
        response = self._get(path, params)
        if response.status_code == 404:
            return None
        if response.status_code == 401:
            raise self._unauthorized(path)
        if response.status_code != 200:
            raise EngineError(
                f"{self.base_url}{path} answered HTTP {response.status_code}",
                "The server may be starting or overloaded; try again shortly.",
            )
        try:
            return response.json()
        except ValueError:
            raise NotVLLM(
                f"{self.base_url}{path} did not return JSON",
                "Is this a vLLM server? Check the URL and port.",
            ) from None

    # ----------------------------------------------------------------- reads
    def health(self) -> bool:
        """200 once the engine serves requests; 503 after the engine died."""
        try:
            return self._get(HEALTH).status_code == 200
        except Unreachable:
            return False

    def version(self) -> str:
        data = self._json(VERSION)
        if not isinstance(data, dict) or not isinstance(data.get("version"), str):
            raise NotVLLM(
                f"{self.base_url} has no {VERSION} answering a version",
                "This does not look like a vLLM server.",
            )
        return str(data["version"])

    def models(self) -> Any:
        """`/v1/models`, or None where it needs the API key kvpilot lacks (noted)."""
        try:
            return self._json(MODELS)
        except Unauthorized:
            self._note(
                f"{MODELS} needs the API key (vLLM's --api-key guards only its /v1 API), so "
                "the model's path and length are unknown: configure the key"
            )
            return None

    def server_info(self) -> Any:
        """`/server_info?config_format=json` where dev mode serves it, else None (remembered)."""
        if self._dev_mode is False:
            return None
        data = self._json(SERVER_INFO, {"config_format": "json"})
        self._dev_mode = data is not None
        return data

    def model_info(self) -> dict[str, Any]:
        data = self._json(MODELS)
        found = from_models(data)
        if not found:
            raise NotVLLM(f"{self.base_url}{MODELS} lists no model")
        return {"model_path": found.get("model"), **found}

    def metrics(self) -> Metrics:
        response = self._exposition(METRICS, _m.SPEC.how_to_enable)
        if response.status_code == 401:
            raise self._unauthorized(METRICS)
        if response.status_code != 200:
            raise EngineError(f"{self.base_url}{METRICS} answered HTTP {response.status_code}")
        m = parse_metrics(response.text)
        if not m.families:
            raise MetricsDisabled(
                f"{self.base_url}{METRICS} has no vLLM metrics", _m.SPEC.how_to_enable
            )
        return m

    def settings(self) -> VLLMSettings:
        """The server's settings and capacity; raises NotVLLM where the server is not vLLM."""
        version = self.version()
        try:
            m: Metrics | None = self.metrics()
        except MetricsDisabled:
            m = None
        models = self.models()
        if m is None:
            entries = models.get("data") if isinstance(models, dict) else None
            owners = [
                e.get("owned_by")
                for e in (entries if isinstance(entries, list) else [])
                if isinstance(e, dict)
            ]
            if models is None:
                raise Unauthorized(
                    f"{self.base_url} answers {VERSION} but exports no vLLM metrics, and its "
                    f"{MODELS} needs the API key, so kvpilot cannot tell that it is vLLM",
                    KEY_HINT,
                )
            if "vllm" not in owners:
                raise NotVLLM(
                    f"{self.base_url} exports no vLLM metrics and its models are not vLLM's",
                    "This does not look like a vLLM server.",
                )
            self._note(
                f"{self.base_url} exports no vLLM metrics (--disable-log-stats): its KV capacity "
                "is unknown and kvpilot cannot measure it"
            )
        info = self.server_info()
        return parse_settings(assemble(version, m, models, info, self.launch_args(), self.notes))

    def launch_args(self) -> list[str] | None:
        """The command line kvpilot launches the server with, read when first needed; a
        launcher that cannot say (its daemon is down) leaves the settings it holds unknown."""
        given = self._launch_args
        if callable(given):
            try:
                given = given()
            except Exception as exc:  # any launcher failure only loses the settings it holds
                self._note(f"the launch command could not be read ({exc}): {NOT_IN_METRICS}")
                given = None
            self._launch_args = given
        return None if given is None else list(given)

    def snapshot(self) -> Snapshot:
        started = self._clock()
        m = self.metrics()
        return self._snapshot(m, started, self._clock())

    def snapshot_of(self, metrics: Metrics) -> Snapshot:
        """A reading with the decode and cache-hit rates since an earlier reading of this
        client (`metrics.reference` says which)."""
        now = self._clock()
        return self._snapshot(metrics, now, now)

    def _snapshot(self, metrics: Metrics, started: float, ended: float) -> Snapshot:
        now = _m.Timed(_m.reading_of(metrics, (started + ended) / 2), ended - started)
        snap = _m.snapshot_from_metrics(metrics, _m.reference(self._history, now), now.reading.at)
        self._history = _m.remember(self._history, now)
        return snap

    def load_snapshot(self) -> Snapshot:
        raise MetricsDisabled(
            "vLLM reports its load only through its metrics (its /load counts in-flight "
            "requests only with --enable-server-load-tracking, and not which of them wait)",
            _m.SPEC.how_to_enable,
        )

    def describe_metrics(self) -> str:
        return f"{self.base_url}{METRICS} (scraped directly)"

    def served_model(self) -> str | None:
        """The served model as `/v1/models` lists it: vLLM refuses a name it does not serve."""
        served = from_models(self.models()).get("served_model_name")
        return None if served is None else str(served)

    @property
    def dialect(self) -> str:
        """`dev mode` where /server_info answered, else `standard` (metrics and /v1/models)."""
        return "dev mode" if self._dev_mode else "standard"


def parse_metrics(text: str) -> Metrics:
    """Every `vllm:` sample with its label set; how label sets combine is `metrics.py`'s.

    Raises NotVLLM where the exposition is SGLang's (or not Prometheus text at all).
    """
    metrics = kit.read_metrics(text, _m.SPEC, NotVLLM, METRICS)
    if not metrics.families and kit.read_families(text, "sglang:", (), NotVLLM, METRICS)[1]:
        raise NotVLLM(f"{METRICS} is SGLang's", "This is an SGLang server.")
    return metrics
