"""SGLang behind the engine seam: everything kvpilot knows about SGLang, in this package.

client.py      the HTTP API (both endpoint dialects): server info, loads, /metrics
metrics.py     SGLang's metric names and the mapping to `Snapshot`
allow_list.py        the launch arguments kvpilot may change: types, ranges, command-line spelling
capacity.py    the KV-pool and memory arithmetic, the safety margins
reserve.py     SGLang's own default reserve per GPU and deployment (the "recommended" floor)
deployment.py  the deployment shape (TP, attention DP, CUDA graphs) from resolved arguments
geometry.py    a model's KV cell from its config.json (GQA, MLA, DSA, hybrid, FP8 checkpoints)
rules.py       what a bottleneck looks like and which changes address it (pure)
signatures.py  what SGLang's exit status and log lines mean
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from playbooks.engines.base import (
    ArgReading,
    LaunchArgs,
    Metrics,
    MetricsSpec,
    ServerSettings,
    Snapshot,
)
from playbooks.engines.exits import ExitCause
from playbooks.engines.sglang import allow_list as _args
from playbooks.engines.sglang import client as _client
from playbooks.engines.sglang import metrics as _metrics
from playbooks.engines.sglang import rules as _rules
from playbooks.engines.sglang import signatures as _signatures
from playbooks.engines.sglang.client import ServerInfo, SGLangClient, parse_server_info

if TYPE_CHECKING:
    from playbooks.engines.types import Bottleneck, DiagnoseSettings, Measurement

METRICS_FLAG = "--enable-metrics"  # kvpilot reads nothing without it
# Endpoints kvpilot calls: both dialects' info and load paths, readiness, metrics.
ENDPOINTS = (*(path for paths in _client.PATHS.values() for path in paths), "/metrics")


def _info(info: ServerSettings) -> ServerInfo:
    if not isinstance(info, ServerInfo):
        raise TypeError(f"SGLang's rules need SGLang's server info, got {type(info).__name__}")
    return info


class SGLang:
    """The SGLang engine (0.5.5 to 0.5.23, both API dialects)."""

    name = "sglang"
    label = "SGLang"
    metrics: MetricsSpec = _metrics.SPEC
    readiness_paths = _client.PATHS["ready"]
    # the largest prefill batch: a campaign may give some of it up for a larger pool
    # (`playbooks.campaigns.room.ChunkCredit`)
    chunk_arg: str | None = "chunked_prefill_size"

    def chunk_of(self, info: ServerSettings) -> int | None:
        """`chunked_prefill_size` as the flag says it; None under attention DP, where SGLang
        reports it divided by the ranks (`parallel_hook.py::_handle_data_parallelism`), and
        where chunking is off (-1)."""
        if info.settings.get("enable_dp_attention"):
            return None
        value = info.settings.get("chunked_prefill_size")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
        return None

    def connect(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        attempts: int = 3,
        wait: Callable[..., float] | None = None,
        clock: Callable[[], float] | None = None,
        launch_args: LaunchArgs = None,
    ) -> SGLangClient:
        """SGLang reports its throughput as a gauge and its settings through /server_info, so
        neither `clock` nor `launch_args` is needed."""
        del clock, launch_args
        return SGLangClient.connect(url, api_key, timeout_s, attempts=attempts, wait=wait)

    def parse_settings(self, raw: Mapping[str, Any]) -> ServerInfo:
        return parse_server_info(dict(raw))

    def stored_settings(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        return _client.stored_settings(raw)

    key_settings = _client.KEY_SETTINGS
    not_compared = _client.NOT_COMPARED

    def snapshot(self, metrics: Metrics) -> Snapshot:
        return _metrics.snapshot_from_metrics(metrics)

    def parse_metrics(self, text: str) -> Metrics:
        return _client.parse_metrics(text)

    def restore_snapshot(self, stored: Mapping[str, Any], t: float = 0.0) -> Snapshot:
        return _metrics.restore_snapshot(stored, t)

    # launch arguments
    def allowed_args(self) -> Mapping[str, str]:
        return {name: spec.meaning for name, spec in _args.ALLOWED.items()}

    def parse_change(self, items: Sequence[str]) -> dict[str, Any]:
        return _args.parse_change(list(items))

    def with_change(self, args: Sequence[str], change: Mapping[str, Any]) -> list[str]:
        return _args.with_change(args, change)

    def arg_value(self, args: Sequence[str], name: str) -> str | None:
        return _args.arg_value(args, name)

    def read_arg(self, args: Sequence[str], name: str) -> ArgReading:
        return _args.read_arg(args, name)

    def spell(self, settings: Mapping[str, Any]) -> list[str]:
        rest = dict(settings)
        metrics = bool(rest.pop("enable_metrics", False))
        return _args.with_change([], rest) + ([METRICS_FLAG] if metrics else [])

    def vocabulary(self) -> frozenset[str]:
        flags = {flag for spec in _args.ALLOWED.values() for flag in spec.spellings}
        return frozenset({*_metrics.NAMES, *flags, *ENDPOINTS, METRICS_FLAG})

    # signatures
    def classify_exit(self, code: int | None, log_tail: str) -> str:
        return _signatures.classify_exit(code, log_tail)

    def exit_cause(self, code: int | None, log_tail: str) -> ExitCause:
        return _signatures.exit_cause(code, log_tail)

    # rules
    def rules_for(
        self, info: ServerSettings, probes: DiagnoseSettings, *, measured: bool = True
    ) -> _rules.ServerRules:
        return _rules.rules_for(_info(info), probes, measured=measured)

    def bottleneck_of(
        self, info: ServerSettings, m: Measurement
    ) -> tuple[Bottleneck, list[str]] | str:
        return _rules.bottleneck_of(_info(info), m)


ENGINE = SGLang()
