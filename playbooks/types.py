"""Typed findings the playbooks return; templates and JSON render them, nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from playbooks.engines.types import Bottleneck, Option

if TYPE_CHECKING:
    from playbooks.engines.timebudget import TimeBudget
    from playbooks.gate.latency import WindowLatency


@dataclass(frozen=True)
class Rate:
    mean: float
    low: float | None
    high: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "mean": round(self.mean, 2),
            "ci95": None
            if self.low is None or self.high is None
            else [round(self.low, 2), round(self.high, 2)],
        }


@dataclass
class DiagnoseFinding:
    playbook: str
    server: str
    version: str
    model: str
    started_at: str
    finished_at: str
    max_total_num_tokens: int
    token_usage: float | None
    running: float
    queued: float
    avg_tokens_per_request: float | None
    avg_prompt_tokens: float | None
    avg_output_tokens: float | None
    bytes_per_token: float
    gpu_memory_gib: float
    gpu_memory_source: str
    requests_that_fit: float | None
    generation: Rate | None
    effective: Rate | None
    prompt_tokens_per_s: float | None
    requests_per_s: float | None
    window_s: float
    batch_s: float
    batches: int
    window_reason: str
    measured_from: str
    cache_hit_fraction: float | None
    retractions: int | None
    bottleneck: Bottleneck
    evidence: list[str]
    options: list[Option]
    notes: list[str] = field(default_factory=list)
    engine: str = "SGLang"  # the engine's label, as people write it
    # p99 TTFT and ITL over the window, each with its target where one is configured
    latency: tuple[WindowLatency, ...] = ()
    slo_held: bool | None = None  # every configured target held (`gate.latency.slo_holds`)
    # where the schedulers' busy time went (`playbooks.engines.timebudget`), where reported
    time_budget: TimeBudget | None = None

    def to_json(self) -> dict[str, Any]:
        def r(x: float | None, n: int = 4) -> float | None:
            return None if x is None else round(x, n)

        return {
            "playbook": self.playbook,
            "server": self.server,
            "engine": self.engine,
            "version": self.version,
            "model": self.model,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "capacity": {
                "max_total_num_tokens": self.max_total_num_tokens,
                "token_usage": r(self.token_usage),
                "running": r(self.running, 2),
                "queued": r(self.queued, 2),
                "avg_tokens_per_request": r(self.avg_tokens_per_request, 1),
                "avg_prompt_tokens": r(self.avg_prompt_tokens, 1),
                "avg_output_tokens": r(self.avg_output_tokens, 1),
                "bytes_per_token": round(self.bytes_per_token, 1),
                "gpu_memory_gib": round(self.gpu_memory_gib, 2),
                "gpu_memory_source": self.gpu_memory_source,
                "requests_that_fit": r(self.requests_that_fit, 1),
            },
            "throughput": {
                "generation_tokens_per_s": None
                if self.generation is None
                else round(self.generation.mean, 2),
                "generation_ci95": None
                if self.generation is None
                else self.generation.to_json()["ci95"],
                "effective_tokens_per_s": None
                if self.effective is None
                else round(self.effective.mean, 2),
                "effective_ci95": None
                if self.effective is None
                else self.effective.to_json()["ci95"],
                "prompt_tokens_per_s": r(self.prompt_tokens_per_s, 2),
                "requests_per_s": r(self.requests_per_s),
                "window_s": round(self.window_s, 1),
                "batch_s": self.batch_s,
                "batches": self.batches,
                "window_reason": self.window_reason,
                "measured_from": self.measured_from,
            },
            "cache_hit_fraction": r(self.cache_hit_fraction),
            "time_budget": None
            if self.time_budget is None
            else {
                "prefill_share": r(self.time_budget.prefill_share),
                "decode_step_ms": round(self.time_budget.step_s(self.time_budget.batch) * 1e3, 3),
                "decode_step_base_ms": round(self.time_budget.step_base_s * 1e3, 3),
                "decode_step_per_request_ms": round(self.time_budget.step_per_request_s * 1e3, 4),
                "decode_batch": round(self.time_budget.batch, 1),
            },
            "retractions": self.retractions,
            "bottleneck": self.bottleneck,
            "evidence": self.evidence,
            "options": [o.to_json() for o in self.options],
            "notes": self.notes,
            "latency": {
                **{r.target.metric: r.to_json() for r in self.latency},
                "slo_held": self.slo_held,
            },
        }
