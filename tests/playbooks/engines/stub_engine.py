"""A read-only engine in the fewest lines: Hugging Face TGI, read through /info and /metrics.

It proves the seam's recipe (CONTRIBUTING.md, "add an engine"): `kit.EngineBase` supplies every
default, so an engine writes its name, metrics, client and rules; it tunes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from playbooks.engines import base
from playbooks.engines.base import Metrics, Snapshot
from playbooks.engines.kit.engine import ClientBase, EngineBase
from playbooks.engines.types import DiagnoseSettings, Measurement, Option

SPEC = base.MetricsSpec("TGI", "tgi_", "tgi_request_queue_duration_bucket", "tgi_queue_size", "")


@dataclass(frozen=True)
class Info:
    raw: dict[str, Any]
    version: str = ""
    model: str = ""
    capacity_tokens: int = 0
    settings: Mapping[str, Any] = field(default_factory=dict)


def parse_info(raw: Mapping[str, Any]) -> Info:
    tokens = int(raw.get("max_batch_total_tokens") or 0)
    return Info(dict(raw), str(raw.get("version", "")), str(raw.get("model_id", "")), tokens)


@dataclass
class Client(ClientBase):
    engine: TGI
    base_url: str
    http: httpx.Client
    dialect: str = "tgi"

    def get(self, path: str) -> httpx.Response:
        try:
            return self.http.get(self.base_url + path)
        except httpx.HTTPError as exc:
            raise base.EngineError(f"TGI at {self.base_url} did not answer: {exc}") from None

    def health(self) -> bool:
        return self.get("/health").status_code == 200

    def settings(self) -> Info:
        return parse_info(self.get("/info").json())

    def model_info(self) -> dict[str, Any]:
        return self.settings().raw

    def metrics(self) -> Metrics:
        return self.engine.parse_metrics(self.get("/metrics").text)

    def close(self) -> None:
        self.http.close()


@dataclass(frozen=True)
class Rules:
    """Reads only: the load, without a bottleneck or a change to propose."""

    notes: list[str]

    def assess(self, m: Measurement) -> base.Assessment:
        said = f"on average {m.running:.1f} requests ran and {m.queued:.1f} waited"
        return base.Assessment("unknown", [said], [], 0.0, 0.0, "unknown", None, self.notes)

    def judge(self, change: dict[str, Any]) -> Option:
        why = ["kvpilot reads TGI servers only"]
        return Option("read-only", change, "unsafe", None, None, "", why)


class TGI(EngineBase):
    name, label, metrics = "tgi", "TGI", SPEC

    def client(self, url: str, api_key: str | None, timeout_s: float) -> Client:
        return Client(self, url.rstrip("/"), httpx.Client(timeout=timeout_s))

    def parse_settings(self, raw: Mapping[str, Any]) -> base.ServerSettings:
        return parse_info(raw)

    def snapshot(self, metrics: Metrics) -> Snapshot:
        queued, running = metrics.get("tgi_queue_size"), metrics.get("tgi_batch_current_size")
        return Snapshot(running=running or 0.0, queued=queued or 0.0)

    def rules_for(self, info: base.ServerSettings, probes: DiagnoseSettings, *,
                  measured: bool = True) -> Rules:  # fmt: skip
        return Rules(["TGI is read only: kvpilot proposes no change"])


ENGINE = TGI()
