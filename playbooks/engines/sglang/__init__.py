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

from collections.abc import Mapping
from typing import Any

from playbooks.engines.base import Metrics, MetricsSpec, ServerSettings, Snapshot
from playbooks.engines.kit.engine import ConnectOptions, TunedEngine
from playbooks.engines.sglang import allow_list as _args
from playbooks.engines.sglang import client as _client
from playbooks.engines.sglang import metrics as _metrics
from playbooks.engines.sglang import rules as _rules
from playbooks.engines.sglang import series as _series
from playbooks.engines.sglang import signatures as _signatures
from playbooks.engines.sglang.client import ServerInfo, SGLangClient, parse_server_info

METRICS_FLAG = "--enable-metrics"  # kvpilot reads nothing without it
# Endpoints kvpilot calls: both dialects' info and load paths, readiness, metrics.
ENDPOINTS = (*(path for paths in _client.PATHS.values() for path in paths), "/metrics")


class SGLang(TunedEngine[ServerInfo, _rules.ServerRules]):
    """The SGLang engine (0.5.5 to 0.5.23, both API dialects)."""

    name = "sglang"
    label = "SGLang"
    metrics: MetricsSpec = _series.SPEC
    readiness_paths = _client.PATHS["ready"]
    # the largest prefill batch: a campaign may give some of it up for a larger pool
    # (`playbooks.campaigns.room.ChunkCredit`)
    chunk_arg: str | None = "chunked_prefill_size"
    key_settings = _client.KEY_SETTINGS
    not_compared = _client.NOT_COMPARED
    arguments = _args
    engine_rules = _rules
    api, signatures = _client, _signatures
    settings_type, settings_name = ServerInfo, "server info"
    own_words = frozenset({*_metrics.NAMES, *ENDPOINTS, METRICS_FLAG})

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

    def open_client(self, url: str, options: ConnectOptions) -> SGLangClient:
        """SGLang reports its throughput as a gauge and its settings through /server_info, so
        neither the caller's clock nor the launch arguments are needed."""
        return SGLangClient.connect(url, options)

    def parse_settings(self, raw: Mapping[str, Any]) -> ServerInfo:
        return parse_server_info(dict(raw))

    def snapshot(self, metrics: Metrics) -> Snapshot:
        return _metrics.snapshot_from_metrics(metrics)

    def restore_snapshot(self, stored: Mapping[str, Any], t: float = 0.0) -> Snapshot:
        """Older rows are in SGLang's own names."""
        return _metrics.restore_snapshot(stored, t)

    def spell(self, settings: Mapping[str, Any]) -> list[str]:
        """The allowed settings, and SGLang's metrics on where they ask for them."""
        rest = dict(settings)
        metrics = bool(rest.pop("enable_metrics", False))
        return super().spell(rest) + ([METRICS_FLAG] if metrics else [])


ENGINE = SGLang()
