"""The engine seam: what kvpilot needs from an inference server, whatever engine runs it.

Everything kvpilot knows about one engine (SGLang today) lives in that engine's package under
`playbooks/engines/`; the rest of kvpilot reads servers only through the types here and the
registry in `playbooks.engines`. `tests/test_architecture.py` holds both sides to it.

The interface, in the order a playbook meets it:

* **connect** - `Engine.connect(url)` gives an `EngineClient`: which dialect answered, the
  server's settings and capacity (`ServerSettings`), and one normalised `Snapshot` of its load.
* **metrics** - `Engine.metrics` says which exposition families are the engine's, so a
  Prometheus server can be asked for exactly them; `Engine.snapshot()` turns them into a
  `Snapshot`.
* **launch arguments** - the allow-list, parsing (`parse_change`), how an argument is spelt
  on a command line (`with_change`, `arg_value`), and what it comes to once the engine's own
  defaults and spellings are taken into account (`read_arg`).
* **signatures** - the readiness path and what the engine's exit status and log lines mean.
* **rules** - what a bottleneck looks like on this engine and which changes address it
  (`rules_for(...).assess`, `.judge`, `bottleneck_of`), as pure functions over typed facts.

Why it is long: it is the engine interface itself: every member an engine offers, with its
contract in its docstring.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, Protocol

from playbooks.engines.exits import ExitCause
from playbooks.engines.timebudget import StepCounters
from playbooks.engines.types import Bottleneck, DiagnoseSettings, Measurement, Option


class EngineError(Exception):
    """A problem talking to a server; `hint` says what the operator can do about it."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}. {self.hint}" if self.hint else self.message


class Unreachable(EngineError):
    """Nothing answered at the server's address."""


class Unauthorized(EngineError):
    """The server wants an API key kvpilot does not have (or has wrong)."""


class WrongEngine(EngineError):
    """Something answered, but not the engine kvpilot was told to expect."""


class MetricsDisabled(EngineError):
    """The server does not export metrics; a load snapshot is all there is."""


class ArgError(ValueError):
    """A launch argument or value that is not allowed; the message says how to fix it."""


@dataclass(frozen=True)
class ArgReading:
    """One launch argument as the engine would run it from an argument list: what "would this
    change anything" compares (`playbooks.experiments.no_change`).

    `origin` is `set` (given in the list: `spelt` is how, `value` typed and in one spelling),
    `default` (absent, and the engine's own default is a constant: `value` is it, `source`
    cites where the engine sets it) or `unknown` (absent, and the engine works the value out at
    start-up from what kvpilot cannot see, or given in a form kvpilot cannot read: `source`
    says which). An unknown reading equals nothing, so a change to it is always a real one."""

    name: str
    flag: str
    origin: Literal["set", "default", "unknown"]
    value: Any = None
    spelt: str = ""
    source: str = ""

    @property
    def known(self) -> bool:
        return self.origin != "unknown"


@dataclass(frozen=True)
class LabelledValue:
    """One exposition sample: its label set (without the metric name) and its value."""

    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class Metrics:
    """One reading of an engine's exposition families, every sample kept with its label set.

    Engine-neutral: which families exist, and how a family's label sets combine (per rank,
    per priority, duplicated across ranks), is the engine's business (`Engine.snapshot` reads
    `labelled`). `get` and `mean` are the label-blind sum and mean, for families whose label
    sets are disjoint parts of one whole. A Prometheus server and a direct scrape both produce
    this, through `Metrics.read`.
    """

    samples: dict[str, float]
    counts: dict[str, int]
    families: frozenset[str]
    ttft_buckets: dict[float, float] = field(default_factory=dict)  # le -> cumulative count
    series: Mapping[str, tuple[LabelledValue, ...]] = field(default_factory=dict)
    # every histogram's buckets: bucket series name -> le -> cumulative count (label sets summed)
    histograms: Mapping[str, Mapping[float, float]] = field(default_factory=dict)

    @classmethod
    def read(
        cls,
        samples: Iterable[tuple[str, Mapping[str, str], float]],
        families: Iterable[str],
        ttft_histogram: str,
    ) -> Metrics:
        """The reading of (sample name, labels, value) triples, wherever they were scraped.

        Histogram buckets and `_created` timestamps are left out of the samples; buckets are
        kept apart, summed over label sets per bound (`histograms`, and the TTFT histogram's in
        `ttft_buckets`); NaN samples say nothing and are dropped.
        """
        kept: dict[str, list[LabelledValue]] = {}
        ttft: dict[float, float] = {}
        histograms: dict[str, dict[float, float]] = {}
        for name, labels, value in samples:
            if "le" in labels and not math.isnan(value):
                le = float(labels["le"])
                bounds = histograms.setdefault(name, {})
                bounds[le] = bounds.get(le, 0.0) + value
            if name == ttft_histogram and "le" in labels:
                le = float(labels["le"])
                ttft[le] = ttft.get(le, 0.0) + value
            if name.endswith("_created") or "le" in labels or math.isnan(value):
                continue
            kept.setdefault(name, []).append(LabelledValue(dict(labels), value))
        return cls(
            samples={name: sum(v.value for v in values) for name, values in kept.items()},
            counts={name: len(values) for name, values in kept.items()},
            families=frozenset(families),
            ttft_buckets=ttft,
            series={name: tuple(values) for name, values in kept.items()},
            histograms=histograms,
        )

    def get(self, name: str) -> float | None:
        """The sum over label sets: right where they are disjoint parts (label-blind)."""
        return self.samples.get(name)

    def mean(self, name: str) -> float | None:
        """The mean over label sets: right for ratios such as token usage."""
        if name not in self.samples:
            return None
        return self.samples[name] / max(1, self.counts.get(name, 1))

    def labelled(self, name: str) -> tuple[LabelledValue, ...]:
        """Every sample of `name` with its label set (empty when the reading has none)."""
        return tuple(self.series.get(name, ()))

    def has(self, family: str) -> bool:
        return family in self.families

    def buckets(self, *names: str) -> tuple[tuple[float, float], ...] | None:
        """The first of `names` (bucket series, newest spelling first) the reading has, as
        (le, cumulative count) pairs, le ascending; None when it has none of them."""
        for name in names:
            if name in self.histograms:
                return tuple(sorted(self.histograms[name].items()))
        return None


@dataclass(frozen=True)
class MetricsSpec:
    """Which exposition series are the engine's, for a source that must ask for them by name.

    `prefix` selects the engine's families; `ttft_histogram` and `itl_histograms` are the
    bucketed series kept (time to first token; inter-token latency, every spelling the engine has
    used); `heartbeat` is a gauge every scrape carries, whose timestamp says how old the newest
    scrape is.
    """

    label: str  # the engine, as people write it
    prefix: str
    ttft_histogram: str
    heartbeat: str
    how_to_enable: str  # for an operator whose server exports none of them
    itl_histograms: tuple[str, ...] = ()

    @property
    def histograms(self) -> tuple[str, ...]:
        """Every bucketed series a source asks for."""
        return (self.ttft_histogram, *self.itl_histograms)


Source = Literal["metrics", "loads"]
# The server's launch command line, or a function reading it when the settings are first needed
# (a Docker or Kubernetes launcher asks its daemon); None where kvpilot does not launch it.
LaunchArgs = Sequence[str] | Callable[[], Sequence[str] | None] | None
STORED_VERSION = 2  # of `Snapshot.to_json`


@dataclass(frozen=True)
class Snapshot:
    """One normalised reading of a server's load: the only sample type kvpilot has.

    Gauges are summed over data-parallel ranks (KV usage and cache hit rate are means);
    counters are cumulative since the server started (None when the engine does not export
    them, 0 when it declares one that has not counted yet). `t` is seconds on the bot's clock
    when it was taken. A hybrid model keeps KV in more than one pool (full attention, sliding
    window, state-space); `kv_usage` is then the fullest pool's share, and each pool's own share
    is kept beside it (None where the engine does not say).

    Stored as JSON (`to_json`) with a version key: version 2 added the per-pool fields; rows
    of version 1 read back with them None. Rows stored before `itl_buckets` read back with it
    None, as for a server that does not export the histogram, and rows stored before
    `decoded_tokens` with that None (the gate then reads the gauge, for both windows).
    """

    t: float = 0.0
    source: Source = "metrics"
    running: float = 0.0
    queued: float = 0.0
    kv_usage: float | None = None  # share of the KV pool in use, 0..1
    decode_rate: float | None = None  # tokens/s generated across running requests, now
    cache_hit_rate: float | None = None  # the engine's own prefix-cache hit rate, 0..1
    capacity_tokens: int | None = None  # KV pool size in tokens
    preempting: float | None = None  # requests being preempted (retracted) right now
    full_usage: float | None = None  # share of the full-attention KV pool in use, 0..1
    swa_usage: float | None = None  # share of the sliding-window KV pool in use, 0..1
    mamba_usage: float | None = None  # share of the state-space (mamba) pool in use, 0..1
    swa_capacity_tokens: int | None = None  # sliding-window KV pool size in tokens
    # counters
    generated_tokens: float | None = None  # output tokens of finished requests
    prompt_tokens: float | None = None
    completed_requests: float | None = None
    cached_tokens: float | None = None  # prompt tokens served from the prefix cache
    aborted_requests: float | None = None
    preemptions: float | None = None  # requests preempted (SGLang: retracted) so far
    # requests refused at admission by a queue limit (vLLM's --max-num-queued-reqs/-tokens,
    # HTTP 503): never queued, so the waiting gauge does not show them
    rejected_requests: float | None = None
    # prefix-cache tokens dropped from the GPU for room, and tokens loaded back from a host
    # tier (SGLang's `evicted_tokens_total`, `load_back_tokens_total`; None where not exported)
    evicted_tokens: float | None = None
    loaded_back_tokens: float | None = None
    # tokens generated by decode steps so far, counted at every step (SGLang 0.5.23's
    # `realtime_tokens_total{mode="decode"}`; None where the engine has no such counter)
    decoded_tokens: float | None = None
    ttft_buckets: tuple[tuple[float, float], ...] = ()  # (le, cumulative count), le ascending
    # the inter-token latency histogram, as `ttft_buckets`; None when the server exports none
    itl_buckets: tuple[tuple[float, float], ...] | None = None
    # Derived, not read: the TTFT p95 over the batch before this reading, where it measured the
    # configuration (`gate.with_ttft_p95` fills it in when a window is judged).
    ttft_p95_s: float | None = None
    # admission: the share of running requests' remaining output the engine reserves (a mean
    # over ranks), and requests waiting outside the KV queue for structured-output grammars
    new_token_ratio: float | None = None
    grammar_queued: float | None = None
    # requests counted in `queued` that wait for something other than KV room (vLLM's
    # `deferred`: a LoRA budget, a KV transfer, a grammar compiling or remote KV arriving)
    deferred_queued: float | None = None
    # the schedulers' own step accounting, cumulative (SGLang's load report; None elsewhere)
    steps: StepCounters | None = None

    COUNTERS = (
        "generated_tokens",
        "prompt_tokens",
        "completed_requests",
        "cached_tokens",
        "aborted_requests",
        "preemptions",
        "decoded_tokens",
        "rejected_requests",
        "evicted_tokens",
        "loaded_back_tokens",
    )

    def at(self, t: float) -> Snapshot:
        return replace(self, t=t)

    @property
    def has_counters(self) -> bool:
        return self.completed_requests is not None or self.generated_tokens is not None

    def counters_went_back(self, earlier: Snapshot) -> bool:
        """Whether any counter is lower than in `earlier`: the server restarted in between."""
        for name in self.COUNTERS:
            before, after = getattr(earlier, name), getattr(self, name)
            if before is not None and after is not None and after < before:
                return True
        return False

    def to_json(self) -> dict[str, Any]:
        """The stored form (without `t`, which storage keeps in its own column)."""
        out: dict[str, Any] = {"v": STORED_VERSION}
        for f in fields(self):
            if f.name in ("t", "ttft_p95_s"):
                continue
            value = getattr(self, f.name)
            if f.name in ("ttft_buckets", "itl_buckets") and value is not None:
                value = [[le, n] for le, n in value]
            if f.name == "steps" and value is not None:
                value = {
                    "prefill_s": value.prefill_s,
                    "moments": list(value.moments),
                    "ranks": value.ranks,
                }
            out[f.name] = value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], t: float = 0.0) -> Snapshot:
        known = {f.name for f in fields(cls)} - {
            "t", "ttft_buckets", "itl_buckets", "ttft_p95_s", "steps",
        }  # fmt: skip
        values: dict[str, Any] = {k: data[k] for k in known if k in data}
        buckets = data.get("ttft_buckets") or []
        itl = data.get("itl_buckets")
        steps = data.get("steps")
        return cls(
            t=t,
            steps=None
            if steps is None
            else StepCounters(
                float(steps["prefill_s"]),
                tuple(map(float, steps["moments"])),
                int(steps.get("ranks", 1)),
            ),
            ttft_buckets=tuple((float(le), float(n)) for le, n in buckets),
            itl_buckets=None if itl is None else tuple((float(le), float(n)) for le, n in itl),
            **values,
        )


def ttft_quantile(before: Snapshot | None, after: Snapshot, q: float) -> float | None:
    """The q-quantile (a bucket bound) of the first-token times observed between two readings."""
    if not after.ttft_buckets:
        return None
    prev = dict(before.ttft_buckets) if before is not None else {}
    deltas = sorted((le, n - prev.get(le, 0.0)) for le, n in after.ttft_buckets)
    total = deltas[-1][1] if deltas else 0.0
    if total <= 0:
        return None
    for le, cum in deltas:
        if cum >= q * total:
            return None if math.isinf(le) else le
    return None


class ServerSettings(Protocol):
    """What a server reports about itself, as far as engine-neutral code reads it."""

    @property
    def version(self) -> str: ...

    @property
    def capacity_tokens(self) -> int:
        """The KV pool's size in tokens."""
        ...

    @property
    def model(self) -> str: ...

    @property
    def settings(self) -> Mapping[str, Any]:
        """The server's launch settings by the engine's own names (shown to people as data)."""
        ...

    @property
    def raw(self) -> dict[str, Any]:
        """What the server answered, stored so a report can judge it later."""
        ...


@dataclass(frozen=True)
class Prompt:
    """One request for an answer: a plain prompt (`text`) or a chat (`messages`, each a role and
    its content). The answer quality check asks every server the same prompts."""

    text: str | None = None
    messages: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if (self.text is None) == (not self.messages):
            raise ValueError("a prompt is either text or chat messages, not both or neither")


class EngineClient(Protocol):
    """A connection to one server. Reads only: nothing here mutates a server."""

    @property
    def engine(self) -> Engine: ...

    @property
    def base_url(self) -> str: ...

    @property
    def dialect(self) -> str:
        """Which API dialect answered (engine-specific; once settings have been read)."""
        ...

    def health(self) -> bool: ...

    def settings(self) -> ServerSettings: ...

    def model_info(self) -> dict[str, Any]: ...

    def metrics(self) -> Metrics:
        """The engine's metrics now; raises MetricsDisabled when the server exports none."""
        ...

    def snapshot(self) -> Snapshot:
        """One reading of the load from the metrics (`t` is 0: the caller stamps it)."""
        ...

    def snapshot_of(self, metrics: Metrics) -> Snapshot:
        """`metrics`, read by this server's client wherever they were scraped (a Prometheus
        source hands them over): an engine that derives rates from counters keeps the reading
        before, so the decode rate is the same whichever source the metrics came from."""
        ...

    def load_snapshot(self) -> Snapshot:
        """A reading without metrics (running, queued, usage): for servers that export none."""
        ...

    def describe_metrics(self) -> str:
        """Where this client's metrics come from, for notes and error messages."""
        ...

    def generate(self, prompt: Prompt, *, max_tokens: int, timeout_s: float) -> str:
        """The server's greedy answer (temperature 0) to `prompt`, at most `max_tokens` long:
        the same prompt asked before and after a change shows whether its answers moved. It
        changes nothing on the server (one request's load); raises EngineError."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Assessment:
    """What an engine's rules make of a server and a measurement of it."""

    bottleneck: Bottleneck
    evidence: list[str]
    options: list[Option]
    bytes_per_token: float
    gpu_memory_gib: float
    gpu_memory_source: str
    requests_that_fit: float | None
    notes: list[str]


class Rules(Protocol):
    """An engine's rules for one server, its capacity and host read before any measurement."""

    def assess(self, m: Measurement) -> Assessment:
        """The bottleneck, the changes that address it, and the capacity facts behind them."""
        ...

    def judge(self, change: dict[str, Any]) -> Option:
        """The safety verdict for one change without a measurement (for experiments)."""
        ...


class Engine(Protocol):
    """Everything kvpilot knows about one inference engine (see the module docstring)."""

    @property
    def name(self) -> str:
        """The configuration name (`engine = "sglang"`)."""
        ...

    @property
    def label(self) -> str:
        """How people write it (SGLang)."""
        ...

    @property
    def metrics(self) -> MetricsSpec: ...

    @property
    def chunk_arg(self) -> str | None:
        """The argument that sets the largest prefill batch, where a campaign may give some of
        it up for a larger pool (SGLang's `chunked_prefill_size`); None elsewhere."""
        ...

    def chunk_of(self, info: ServerSettings) -> int | None:
        """The `chunk_arg` flag's value the server runs with, where its settings say it in the
        flag's own units (None: no such argument, or a server that reports it otherwise)."""
        ...

    @property
    def readiness_paths(self) -> tuple[str, ...]:
        """The HTTP paths, newest first, that answer 200 once the server serves requests; a
        404 means the server predates that path and the next is asked."""
        ...

    # connect
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
        """`clock`: the caller's clock in seconds, for rates between two readings (an
        accelerated twin runs faster than the wall clock). `launch_args`: the command line kvpilot
        launches the server with (or a function that reads it when first needed), for settings
        an engine does not report about itself; an engine that reports them all ignores it."""
        ...

    def parse_settings(self, raw: Mapping[str, Any]) -> ServerSettings:
        """Stored settings (`ServerSettings.raw`) read back."""
        ...

    def stored_settings(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """What to store of a server's answer: its settings, no secrets, no moving values."""
        ...

    @property
    def key_settings(self) -> tuple[str, ...]:
        """The settings a report shows for the configuration now."""
        ...

    @property
    def not_compared(self) -> frozenset[str]:
        """Stored keys that are state, not settings: left out of "what changed"."""
        ...

    # metrics
    def snapshot(self, metrics: Metrics) -> Snapshot: ...

    def parse_metrics(self, text: str) -> Metrics:
        """The engine's families out of Prometheus exposition text."""
        ...

    # launch arguments
    def allowed_args(self) -> Mapping[str, str]:
        """Every argument kvpilot may change: name -> what it is, for help texts."""
        ...

    def parse_change(self, items: Sequence[str]) -> dict[str, Any]:
        """`KEY=VALUE` items, typed and range-checked (raises ArgError)."""
        ...

    def with_change(self, args: Sequence[str], change: Mapping[str, Any]) -> list[str]:
        """A server argument list with the change applied (raises ArgError)."""
        ...

    def arg_value(self, args: Sequence[str], name: str) -> str | None: ...

    def read_arg(self, args: Sequence[str], name: str) -> ArgReading:
        """An allowed argument as the engine would run it from `args`: every spelling the
        engine reads, the value typed, and the engine's own default where the flag is absent
        and that default is a constant (raises ArgError for an argument kvpilot cannot change)."""
        ...

    def spell(self, settings: Mapping[str, Any]) -> list[str]:
        """Settings as command-line arguments: the allowed ones, plus what kvpilot needs on
        (the engine's metrics)."""
        ...

    def vocabulary(self) -> frozenset[str]:
        """The engine's metric names, flag spellings and endpoints: only its package spells them."""
        ...

    # signatures
    def classify_exit(self, code: int | None, log_tail: str) -> str:
        """Why a server went down, from its exit status and its own log lines."""
        ...

    def exit_cause(self, code: int | None, log_tail: str) -> ExitCause:
        """The same reading with its kind: whether it is evidence about memory."""
        ...

    # rules
    def rules_for(
        self, info: ServerSettings, probes: DiagnoseSettings, *, measured: bool = True
    ) -> Rules:
        """The rules for this server; raises ValueError when the engine cannot reason about it."""
        ...

    def bottleneck_of(
        self, info: ServerSettings, m: Measurement
    ) -> tuple[Bottleneck, list[str]] | str:
        """The bottleneck over stored measurements (reports), or why it cannot be judged."""
        ...

    def restore_snapshot(self, stored: Mapping[str, Any], t: float = 0.0) -> Snapshot:
        """A stored sample read back (older rows may be in the engine's own names)."""
        ...
