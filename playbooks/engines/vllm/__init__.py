"""vLLM behind the engine seam: everything kvpilot knows about vLLM, in this package.

client.py      the HTTP API: detection, settings and capacity without dev mode, /metrics
metrics.py     vLLM's metric names and the mapping to `Snapshot` (rates from counters)
allow_list.py        the launch arguments kvpilot may change: types, ranges, command-line spelling
geometry.py    a model's KV page from its config.json, as vLLM sizes one
capacity.py    vLLM's KV memory arithmetic and capacity after a change
rules.py       what a bottleneck looks like and which changes address it (pure), with
               facts.py, bottleneck.py, proposed_change.py, verdicts.py, proposals.py
signatures.py  what vLLM's exit status and log lines mean

Shared with the other engines: `playbooks.engines.launch_args` (typed values, argument lists),
`findings` (a check's answer and their combination) and `hf_config` (config.json fields).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from playbooks.engines.base import Metrics, MetricsSpec, Snapshot
from playbooks.engines.kit.engine import ConnectOptions, TunedEngine
from playbooks.engines.vllm import allow_list as _args
from playbooks.engines.vllm import client as _client
from playbooks.engines.vllm import metrics as _metrics
from playbooks.engines.vllm import rules as _rules
from playbooks.engines.vllm import signatures as _signatures
from playbooks.engines.vllm.client import VLLMClient, VLLMSettings, parse_settings


class VLLM(TunedEngine[VLLMSettings, _rules.ServerRules]):
    """The vLLM engine (the v1 engine, as of 0.32; metric names back to 0.10).

    vLLM's options do not say what GPU memory they add, so no room is traded for them: no
    `chunk_arg`. Its metrics are on unless --disable-log-stats, so `spell` adds nothing for
    them, and its samples were always stored as `Snapshot`s (the default `restore_snapshot`).
    """

    name = "vllm"
    label = "vLLM"
    metrics: MetricsSpec = _metrics.SPEC
    readiness_paths = (_client.HEALTH,)
    arguments = _args
    engine_rules = _rules
    api, signatures = _client, _signatures
    settings_type, settings_name = VLLMSettings, "settings"
    key_settings = _client.KEY_SETTINGS
    not_compared = _client.NOT_COMPARED
    own_words = frozenset({*_metrics.NAMES, *_client.ENDPOINTS})

    def open_client(self, url: str, options: ConnectOptions) -> VLLMClient:
        """`launch_args`: the server's command line where kvpilot knows it, for the settings
        vLLM does not report without dev mode (`max_num_seqs`, the token budget, TP); `clock`
        times the decode rate, which vLLM exports only as a counter."""
        return VLLMClient.connect(url, options)

    def parse_settings(self, raw: Mapping[str, Any]) -> VLLMSettings:
        return parse_settings(raw)

    def snapshot(self, metrics: Metrics) -> Snapshot:
        """One reading alone: no decode rate (that needs two; the client has it)."""
        return _metrics.snapshot_from_metrics(metrics)


ENGINE = VLLM()
