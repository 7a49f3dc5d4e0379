"""The servers `bench.tune` tunes: their load, the configuration they start from, the hidden
activation peaks they may have, the oracle's grid and the plan kvpilot's campaign is allowed.

The hidden peaks. The twin's crash model is the activation need kvpilot's safety floor is
built from (`sim.memory.activation_need_gib`), so at the modelled peak a change kvpilot calls
safe never dies. A real server peaks higher (allocator fragmentation, kernels' workspaces,
driver versions, NCCL and DP-attention buffers that grow with the batch), which is why SGLang
reserves more than its own rule of thumb: `512 + 1.5 MB per chunk token + 2 MB per decode
graph + 1 GiB per 8 TP ranks` (plus DP attention's gather buffers), at least 10 GiB
(`server_args.py _handle_gpu_memory_settings`), where the twin models 0.49 GiB per 1K tokens of
a Kimi prefill chunk; and its tuning guide asks for 5-8 GB left for activations. sglang #5372
started at 0.94 and ran out of memory under load. So each scenario's true peak is drawn
between the modelled need and SGLang's default reserve: the true need of the default batch
(a full prefill chunk) takes a share 0, 1/3 or 2/3 of the gap between the modelled need and the
room SGLang's default fraction leaves after the CUDA graphs. A share of 1 would be SGLang's
own default just fitting; none of these is above it, so a configuration that keeps SGLang's
default reserve survives every one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import product

from playbooks.campaigns.policy import Allowance, Range
from sim.args import resolve
from sim.memory import headroom, modelled_activation_gib

PEAK_SHARES = (0.0, 1 / 3, 2 / 3)
QUICK_SHARES = (0.0, 2 / 3)
# What a restart costs, in simulated minutes: the preset's start-up (weights, graphs: 8 min for
# the incident's Kimi-K2.5) and half a minute to stop and pass readiness; bench/experiment.py
# measured 8.5-8.6 min on the incident twin (BENCHMARKS.md, "Experiments").
STOP_AND_READY_S = 30.0
# kvpilot tune's default restarts per campaign (`--max-experiments`)
MAX_EXPERIMENTS = 3
HICACHE_FLAG = "--enable-hierarchical-cache"


@dataclass(frozen=True)
class Scenario:
    """One server to tune and what tuning it may change."""

    name: str
    story: str
    preset: str
    workload: str  # a `sim.workload` profile, or `long-prompt` (bench/tune_twin.py)
    clients: int
    current: tuple[str, ...]  # the launch arguments it runs with (besides the preset's)
    fractions: tuple[float, float]  # the oracle's range, 0.01 apart; also the plan's
    chunks: tuple[int, ...] = (8192, 4096, 2048)
    max_running: tuple[int | None, ...] = (None,)  # None: SGLang's own
    hicache: tuple[tuple[str, ...], ...] = ((),)  # extra flags; () is off
    fp8: bool = False  # FP8 KV allowed (an opt-in: it trades accuracy away)
    # SGLang version the twin speaks: the release whose load report accounts for step times
    version: str | None = "0.5.23"
    gpu_memory_gib: float | None = None  # [servers] gpu_memory_gib, as an operator would set it
    host_ram_gib: float | None = None  # [servers] host_ram_gib
    warm_s: float = 600.0  # how long the server has been up when the campaign starts
    # The oracle's throughput window after a cold start (from, to); the hour's survival is
    # judged whatever its length.
    window: tuple[float, float] = (600.0, 2400.0)
    shares: tuple[float, ...] = PEAK_SHARES
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def base(self) -> list[str]:
        version = ["--sglang-version", self.version] if self.version else []
        return ["--preset", self.preset, *version, "--enable-metrics"]

    @property
    def current_args(self) -> list[str]:
        return [*self.base, *self.current]

    def fraction_values(self) -> list[float]:
        low, high = self.fractions
        return [round(low + i / 100, 2) for i in range(round((high - low) * 100) + 1)]

    def grid(self) -> Iterator[list[str]]:
        """The oracle's configurations: every combination of the stated values."""
        dtypes: Sequence[str | None] = (None, "fp8_e4m3") if self.fp8 else (None,)
        for f, chunk, running, cache, dtype in product(
            self.fraction_values(), self.chunks, self.max_running, self.hicache, dtypes
        ):
            args = [*self.base, "--mem-fraction-static", f"{f:.2f}"]
            args += ["--chunked-prefill-size", str(chunk)]
            if running is not None:
                args += ["--max-running-requests", str(running)]
            args += list(cache)
            if dtype is not None:
                args += ["--kv-cache-dtype", dtype]
            yield args

    def allowance(self) -> Allowance:
        """The plan approved once (`kvpilot tune --allow ... --yes`): the oracle's arguments,
        each over its range; FP8 KV only where opted in."""
        low, high = self.fractions
        ranges = {
            "mem_fraction_static": Range(low, high),
            "chunked_prefill_size": Range(float(min(self.chunks)), float(max(self.chunks))),
            "max_running_requests": Range(16.0, 4096.0),
            "enable_hierarchical_cache": Range(values=frozenset({"True"})),
            "hicache_size": Range(1.0, 64.0),
            "hicache_ratio": Range(1.0, 4.0),
        }
        if self.fp8:
            ranges["kv_cache_dtype"] = Range(values=frozenset({"fp8_e4m3"}))
        return Allowance(ranges, MAX_EXPERIMENTS, stop_at_first_not_kept=True)

    def restart_s(self) -> float:
        return resolve(self.current_args).preset.startup_s + STOP_AND_READY_S

    def peak_scales(self) -> list[float]:
        """The hidden peaks as multiples of the modelled one (see the module's docstring)."""
        default = list(self.current_args)
        if "--mem-fraction-static" in default:  # SGLang's own fraction for this deployment
            i = default.index("--mem-fraction-static")
            del default[i : i + 2]
        cfg = resolve(default)
        fraction = float(cfg.server_args["mem_fraction_static"])
        hicache = bool(cfg.server_args["enable_hierarchical_cache"])
        room = headroom(cfg.preset, fraction, hicache).activation_gib
        need = modelled_activation_gib(cfg.preset, max(1, cfg.chunked_prefill_size))
        return [round((need + share * (room - need)) / need, 4) for share in self.shares]


KIMI_RTX = "kimi-k2.5-rtxpro6000-tp8"
KIMI_DP = "kimi-k2.5-h200-tp8-dpattn"
# As `make demo` configures the incident's server (bot/console/demo.py).
DEMO_GPU_GIB = 95.59
DEMO_HOST_GIB = 256.0
INCIDENT_FRACTIONS = (0.83, 0.93)
INCIDENT_HICACHE: tuple[tuple[str, ...], ...] = ((), (HICACHE_FLAG,))

SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "incident",
        "Kimi-K2.5 on 8x RTX PRO 6000, 150 clients of ~4K-token requests, KV-bound at 0.85",
        KIMI_RTX,
        "incident",
        150,
        ("--mem-fraction-static", "0.85"),
        INCIDENT_FRACTIONS,
        max_running=(None, 64),
        hicache=INCIDENT_HICACHE,
        gpu_memory_gib=DEMO_GPU_GIB,
        host_ram_gib=DEMO_HOST_GIB,
    ),
    Scenario(
        "multi-turn",
        "the same server, 150 chat sessions over shared documents (prefix reuse)",
        KIMI_RTX,
        "multi-turn",
        150,
        ("--mem-fraction-static", "0.85"),
        INCIDENT_FRACTIONS,
        hicache=((), (HICACHE_FLAG,), (HICACHE_FLAG, "--hicache-size", "24")),
        gpu_memory_gib=DEMO_GPU_GIB,
        host_ram_gib=DEMO_HOST_GIB,
    ),
    Scenario(
        "short-chat",
        "the same server, 64 clients of short prompts and answers (not KV-bound)",
        KIMI_RTX,
        "short-chat",
        64,
        ("--mem-fraction-static", "0.85"),
        INCIDENT_FRACTIONS,
        chunks=(8192, 4096),
        gpu_memory_gib=DEMO_GPU_GIB,
        host_ram_gib=DEMO_HOST_GIB,
        # Requests of seconds: steady within two minutes, and its radix cache of thousands of
        # short entries makes this the twin's slowest load per simulated minute.
        window=(120.0, 720.0),
    ),
    Scenario(
        "long-prompt",
        "the same server, 24 clients of 2K-32K-token documents and short answers (prefill)",
        KIMI_RTX,
        "long-prompt",
        24,
        ("--mem-fraction-static", "0.85"),
        INCIDENT_FRACTIONS,
        chunks=(16384, 8192, 4096, 2048),
        gpu_memory_gib=DEMO_GPU_GIB,
        host_ram_gib=DEMO_HOST_GIB,
    ),
    Scenario(
        "client-bound",
        "the same server, 24 clients of ~4K-token requests: the queue is empty",
        KIMI_RTX,
        "incident",
        24,
        ("--mem-fraction-static", "0.85"),
        INCIDENT_FRACTIONS,
        gpu_memory_gib=DEMO_GPU_GIB,
        host_ram_gib=DEMO_HOST_GIB,
    ),
    Scenario(
        "fp8-opt-in",
        "the incident with FP8 KV allowed by the plan (--allow kv_cache_dtype=fp8_e4m3)",
        KIMI_RTX,
        "incident",
        150,
        ("--mem-fraction-static", "0.85"),
        INCIDENT_FRACTIONS,
        fp8=True,
        gpu_memory_gib=DEMO_GPU_GIB,
        host_ram_gib=DEMO_HOST_GIB,
    ),
    Scenario(
        "dp-attention",
        "Kimi-K2.5 at TP8 with DP attention 8 on 8x H200 (SGLang 0.5.23, its default "
        "fraction), 384 clients of long documents",
        KIMI_DP,
        "long-prompt",
        384,
        (),
        (0.74, 0.86),
        chunks=(8192, 16384),
        version="0.5.23",
        host_ram_gib=2048.0,
    ),
)


def scenario_named(name: str) -> Scenario:
    for s in SCENARIOS:
        if s.name == name:
            return s
    known = ", ".join(s.name for s in SCENARIOS)
    raise ValueError(f"unknown scenario {name!r}; choose one of: {known}")
