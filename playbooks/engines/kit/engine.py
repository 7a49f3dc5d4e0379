"""`EngineBase`: the engine interface (`base.Engine`) with a default for every member an engine
need not know about, so a new engine writes only what it alone knows.

An engine supplies its name and label, its metrics (`MetricsSpec` and `snapshot`), its client
(`connect`, `parse_settings`) and its rules (`rules_for`). Everything else has a safe default:
a read-only engine (one kvpilot diagnoses but cannot restart or tune) changes no launch
arguments, so each member that would edit or read a command line refuses with an `ArgError`
saying so; its exits read as crashes with the log's last line; a stored sample is read back as
the seam stores it. An engine that can be tuned overrides the launch-argument members, as
SGLang and vLLM do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from playbooks.engines.base import (
    ArgError,
    ArgReading,
    EngineClient,
    EngineError,
    LaunchArgs,
    Metrics,
    MetricsSpec,
    Prompt,
    ServerSettings,
    Snapshot,
    WrongEngine,
)
from playbooks.engines.exits import ExitCause, Failure, last_log_line
from playbooks.engines.types import Bottleneck, Measurement


class ClientBase:
    """Defaults for `base.EngineClient` over an engine's `metrics()`: a snapshot is the
    engine's reading of them, with or without metrics alike; no prompts are asked."""

    engine: Any
    base_url: str

    def metrics(self) -> Metrics:
        raise NotImplementedError

    def snapshot(self) -> Snapshot:
        return self.snapshot_of(self.metrics())

    def snapshot_of(self, metrics: Metrics) -> Snapshot:
        snapshot: Snapshot = self.engine.snapshot(metrics)
        return snapshot

    def load_snapshot(self) -> Snapshot:
        return self.snapshot()

    def describe_metrics(self) -> str:
        return f"{self.base_url}/metrics"

    def generate(self, prompt: Prompt, *, max_tokens: int, timeout_s: float) -> str:
        raise EngineError(f"kvpilot asks {self.engine.label} servers no prompts")


class EngineBase:
    """Defaults for `base.Engine`; a subclass sets `name`, `label`, `metrics` and implements
    `client` (or `connect`), `parse_settings`, `snapshot` and `rules_for`."""

    name: str
    label: str
    metrics: MetricsSpec
    chunk_arg: str | None = None
    readiness_paths: tuple[str, ...] = ("/health",)
    key_settings: tuple[str, ...] = ()
    not_compared: frozenset[str] = frozenset()

    def chunk_of(self, info: ServerSettings) -> int | None:
        return None

    def client(self, url: str, api_key: str | None, timeout_s: float) -> EngineClient:
        raise NotImplementedError

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
    ) -> EngineClient:
        """`client(url, api_key, timeout_s)`: an engine that reports its settings and rates
        itself needs neither the caller's clock nor the launch arguments."""
        return self.client(url, api_key, timeout_s)

    def stored_settings(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        return dict(raw)

    def parse_metrics(self, text: str) -> Metrics:
        """The families under the engine's prefix, from Prometheus exposition text."""
        try:
            parsed = list(text_string_to_metric_families(text))
        except ValueError as exc:
            raise WrongEngine(f"/metrics is not Prometheus text: {exc}") from None
        families = [f for f in parsed if f.name.startswith(self.metrics.prefix)]
        return Metrics.read(
            ((s.name, s.labels, s.value) for f in families for s in f.samples),
            (f.name for f in families),
            ttft_histogram=self.metrics.ttft_histogram,
        )

    def restore_snapshot(self, stored: Mapping[str, Any], t: float = 0.0) -> Snapshot:
        return Snapshot.from_json(stored, t)

    # launch arguments: none, for a read-only engine
    def _read_only(self) -> ArgError:
        return ArgError(f"kvpilot reads {self.label} servers only: it changes no launch arguments")

    def allowed_args(self) -> Mapping[str, str]:
        return {}

    def parse_change(self, items: Sequence[str]) -> dict[str, Any]:
        if items:
            raise self._read_only()
        return {}

    def with_change(self, args: Sequence[str], change: Mapping[str, Any]) -> list[str]:
        if change:
            raise self._read_only()
        return list(args)

    def arg_value(self, args: Sequence[str], name: str) -> str | None:
        return None

    def read_arg(self, args: Sequence[str], name: str) -> ArgReading:
        raise self._read_only()

    def spell(self, settings: Mapping[str, Any]) -> list[str]:
        raise self._read_only()

    def vocabulary(self) -> frozenset[str]:
        return frozenset()

    # signatures
    def exit_cause(self, code: int | None, log_tail: str) -> ExitCause:
        line = last_log_line(log_tail)
        status = "with no status" if code is None else f"with status {code}"
        said = f"{self.label} exited {status}" + (f": {line}" if line else "")
        return ExitCause(Failure.crashed, said)

    def classify_exit(self, code: int | None, log_tail: str) -> str:
        return self.exit_cause(code, log_tail).reason

    def bottleneck_of(
        self, info: ServerSettings, m: Measurement
    ) -> tuple[Bottleneck, list[str]] | str:
        return f"kvpilot has no {self.label} rules for stored measurements"
