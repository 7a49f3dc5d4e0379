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
from playbooks.engines.vllm import allow_list as _args
from playbooks.engines.vllm import client as _client
from playbooks.engines.vllm import metrics as _metrics
from playbooks.engines.vllm import rules as _rules
from playbooks.engines.vllm import signatures as _signatures
from playbooks.engines.vllm.client import VLLMClient, VLLMSettings, parse_settings

if TYPE_CHECKING:
    from playbooks.engines.types import Bottleneck, DiagnoseSettings, Measurement


def _info(info: ServerSettings) -> VLLMSettings:
    if not isinstance(info, VLLMSettings):
        raise TypeError(f"vLLM's rules need vLLM's settings, got {type(info).__name__}")
    return info


class VLLM:
    """The vLLM engine (the v1 engine, as of 0.32; metric names back to 0.10)."""

    name = "vllm"
    label = "vLLM"
    metrics: MetricsSpec = _metrics.SPEC
    readiness_paths = (_client.HEALTH,)
    # vLLM's options do not say what GPU memory they add, so no room is traded for them
    chunk_arg: str | None = None

    def chunk_of(self, info: ServerSettings) -> int | None:
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
    ) -> VLLMClient:
        """`launch_args`: the server's command line where kvpilot knows it, for the settings
        vLLM does not report without dev mode (`max_num_seqs`, the token budget, TP); `clock`
        times the decode rate, which vLLM exports only as a counter."""
        return VLLMClient.connect(
            url,
            api_key,
            timeout_s,
            attempts=attempts,
            wait=wait,
            launch_args=launch_args,
            clock=clock,
        )

    def parse_settings(self, raw: Mapping[str, Any]) -> VLLMSettings:
        return parse_settings(raw)

    def stored_settings(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        return _client.stored_settings(raw)

    key_settings = _client.KEY_SETTINGS
    not_compared = _client.NOT_COMPARED

    def snapshot(self, metrics: Metrics) -> Snapshot:
        """One reading alone: no decode rate (that needs two; the client has it)."""
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
        """vLLM's metrics are on unless --disable-log-stats, so nothing is added for them."""
        return _args.with_change([], settings)

    def vocabulary(self) -> frozenset[str]:
        flags = {flag for spec in _args.ALLOWED.values() for flag in spec.spellings}
        return frozenset({*_metrics.NAMES, *flags, *_client.ENDPOINTS})

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


ENGINE = VLLM()
