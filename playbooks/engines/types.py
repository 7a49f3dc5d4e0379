"""The engine seam's input and answer types: what an engine's rules are given and return.

They live with the seam, not with the playbooks that fill them in, so an engine reads them
without importing the diagnosis (which imports the engines): a measurement of a server
(`Measurement`, made by `playbooks.diagnose.measure`), the probes and changes a diagnosis asks
about (`DiagnoseSettings`), and the answer's vocabulary (`Bottleneck`, `Option`, `Verdict`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from playbooks.engines.timebudget import TimeBudget
from playbooks.sources.gpu import GpuReader
from playbooks.sources.host import HostReader
from playbooks.sources.model_config import ModelConfigReader
from playbooks.stats.intervals import Interval

Verdict = Literal["recommended", "possible", "needs_opt_in", "unsafe", "not_useful"]
# "stalled": the server answers but generates nothing (`playbooks.experiments.stall`); no
# engine's rules name it, the diagnosis does, over their answer
Bottleneck = Literal["kv_cache", "compute", "client", "prefill", "unknown", "stalled"]
VERDICT_ORDER: dict[str, int] = {
    "unsafe": 0,
    "needs_opt_in": 1,
    "not_useful": 2,
    "possible": 3,
    "recommended": 4,
}


@dataclass(frozen=True)
class Option:
    """One change (or action) with its prediction and verdict."""

    title: str
    change: dict[str, Any]  # SGLang server-arg names -> values; {} for actions off the server
    verdict: Verdict
    predicted_max_total_num_tokens: int | None
    predicted_gain: tuple[float, float] | None  # relative throughput change, low..high
    risk: str
    reasons: list[str]
    considered: bool = False  # asked for with --consider
    # GPU memory per GPU the change adds to the server's static allocations (the KV pool, a
    # cache's buffers), where the engine's rules can say: what a measured room must hold
    static_gpu_gib: float | None = None

    def to_json(self) -> dict[str, Any]:
        gain = None
        if self.predicted_gain is not None:
            low, high = self.predicted_gain
            gain = {"low": round(low, 4), "high": round(high, 4)}
        return {
            "title": self.title,
            "change": self.change,
            "predicted_max_total_num_tokens": self.predicted_max_total_num_tokens,
            "predicted_throughput_change": gain,
            "verdict": self.verdict,
            "risk": self.risk,
            "reasons": self.reasons,
            "considered": self.considered,
        }


@dataclass(frozen=True)
class MeasurePlan:
    precision: float = 0.05
    confidence: float = 0.95
    min_window_s: float = 180.0
    max_window_s: float = 900.0
    batch_s: float = 30.0
    scrape_s: float = 5.0
    fixed_window_s: float | None = None

    def __post_init__(self) -> None:
        if not 0 < self.precision < 1:
            raise ValueError(f"precision must be between 0 and 1, got {self.precision}")
        if self.fixed_window_s is not None and self.fixed_window_s < 2 * self.scrape_s:
            raise ValueError(
                f"a window of {self.fixed_window_s:g} s is too short: it must cover at least two "
                f"scrapes ({2 * self.scrape_s:g} s)"
            )
        if self.min_window_s > self.max_window_s:
            raise ValueError("min_window_s must not exceed max_window_s")


@dataclass
class Measurement:
    window_s: float
    batch_s: float
    batches: int
    lag1: float
    stop_reason: str
    source: str  # "metrics" or "loads"
    generation: Interval | None
    effective: Interval | None
    prompt_tokens_per_s: float | None
    requests_per_s: float | None
    completed_requests: int | None
    avg_prompt_tokens: float | None
    avg_output_tokens: float | None
    running: float
    queued: float
    queued_max: float
    queue_nonempty_fraction: float
    token_usage: float | None
    cache_hit_rate: float | None
    cached_fraction: float | None
    retractions: int | None
    retractions_seen_in_gauge: int
    usage_trend: tuple[float, float] | None = None  # mean usage in the first and last third
    # A hybrid model's KV pools, each its own window mean (`token_usage` is the fullest's).
    full_usage: float | None = None
    swa_usage: float | None = None
    mamba_usage: float | None = None
    swa_capacity_tokens: int | None = None  # the sliding-window pool's size, newest reading
    notes: list[str] = field(default_factory=list)
    new_token_ratio: float | None = None  # the engine's reserve share of remaining output, mean
    grammar_queued: float | None = None  # mean requests waiting for a grammar to compile
    deferred_queued: float | None = None  # mean of `queued` waiting for other than KV room
    rejections: int | None = None  # requests refused at admission by a queue limit, window
    evicted_tokens: int | None = None  # prefix-cache tokens dropped from the GPU, window
    loaded_back_tokens: int | None = None  # tokens loaded back from a host tier, window
    # where the schedulers' busy time went (None where the engine does not account for it)
    time_budget: TimeBudget | None = None

    @property
    def avg_tokens_per_request(self) -> float | None:
        if self.avg_prompt_tokens is None or self.avg_output_tokens is None:
            return None
        return self.avg_prompt_tokens + self.avg_output_tokens


@dataclass(frozen=True)
class DiagnoseSettings:
    """The measurement plan, the changes asked about, and the probes the rules may read."""

    plan: MeasurePlan = field(default_factory=MeasurePlan)
    consider: tuple[dict[str, Any], ...] = ()
    gpu_memory_gib: float | None = None  # free GPU memory before weights, per GPU (config)
    gpus: GpuReader | None = None  # only when the bot runs on the server's GPU host
    host: HostReader | None = None
    models: ModelConfigReader | None = None  # the served model's config.json, on the GPU host
    # latency targets the window's p99s are held to (configuration; None: reported only)
    ttft_p99_s: float | None = None
    itl_p99_ms: float | None = None
