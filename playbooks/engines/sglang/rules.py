"""SGLang's rules: what a bottleneck looks like on an SGLang server, and which changes help.

Pure functions over typed facts (server info, a measurement, the capacity model, host memory),
in modules of their own:

facts.py        the facts the rules read (`Server` before a measurement, `Context` with one)
bottleneck.py   `analyse()`: the bottleneck with numbers, an ordered table of rules
proposed_change.py       what a check of a launch argument is: a safety half, a usefulness half
argument_checks.py    one check per launch argument, in a table by name
hicache.py      the hierarchical cache's host pool against host RAM
verdicts.py     `evaluate()` one change with a measurement, `judge_change()` without
proposals.py    `propose()`: the changes for a bottleneck, an ordered table of rules

The skeleton they fill in (the bottleneck table's walk, a check's halves, the verdicts, `assess`
and `judge`) is shared: `playbooks.engines.kit`. This module gathers the facts (GPU memory, the
capacity model, host RAM) and is the entry point: `rules_for()` and `bottleneck_of()`.
`--consider KEY=VALUE` runs exactly the same checks as the bot's own proposals.
"""

from __future__ import annotations

from dataclasses import replace

from playbooks.engines.disaggregation import ROLES, not_judged
from playbooks.engines.kit import rules as kit
from playbooks.engines.sglang.bottleneck import analyse
from playbooks.engines.sglang.bottleneck import evidence as measured_evidence
from playbooks.engines.sglang.capacity import CapacityModel, GpuMemory, build_model
from playbooks.engines.sglang.client import ServerInfo
from playbooks.engines.sglang.deployment import (
    attn_dp_size,
    deployment_of,
    parse_version,
    post_capture_kv_sizing,
)
from playbooks.engines.sglang.facts import (
    Context,
    Server,
    ranks_on_host,
    requests_fitting,
)
from playbooks.engines.sglang.geometry import Geometry, geometry_of
from playbooks.engines.sglang.proposals import propose
from playbooks.engines.sglang.reserve import sglang_reserve
from playbooks.engines.sglang.verdicts import evaluate, judge_change
from playbooks.engines.types import Bottleneck, DiagnoseSettings, Measurement
from playbooks.sources.gpu import GpuUnavailable

CUDA_CONTEXT_GIB = 0.5  # what the CUDA context takes before SGLang measures free memory
# What judging a disaggregated SGLang node would take (0.5.23 disaggregation/decode.py and the
# queue gauges of observability/metrics_collector.py)
PD_NEEDS = (
    "the transfer queues (sglang:num_decode_prealloc_queue_reqs, "
    "sglang:num_decode_transfer_queue_reqs, sglang:num_prefill_inflight_queue_reqs) and the "
    "other role's load, which kvpilot does not read"
)


def pd_role(info: ServerInfo) -> str | None:
    """`--disaggregation-mode` prefill or decode; None for a colocated server ("null")."""
    mode = info.arg("disaggregation_mode")
    return str(mode) if mode in ROLES else None


def resolve_gpu_memory(
    info: ServerInfo, settings: DiagnoseSettings
) -> tuple[GpuMemory | None, list[str]]:
    notes: list[str] = []
    if settings.gpu_memory_gib is not None:
        return GpuMemory(settings.gpu_memory_gib, "configuration", True), notes
    sa = info.memory.startup_available_gb
    fraction = info.mem_fraction_static
    if sa is not None and fraction is not None and 0 < fraction < 1:
        graph = 0.0 if post_capture_kv_sizing(info) else info.memory.graph_gb or 0.0
        if info.arg("max_total_tokens") is None:
            source, pre = before_load_from_split(
                sa, graph, (info.memory.weight_gb or 0.0) + (info.memory.kvcache_gb or 0.0),
                fraction,
            )  # fmt: skip
            return GpuMemory(pre, f"server: {source}", True, total_mib=_nvml_total(settings)), notes
        known = sa + graph + (info.memory.weight_gb or 0.0) + (info.memory.kvcache_gb or 0.0)
        notes.append(
            "the KV pool is capped by --max-total-tokens, so GPU memory is taken as "
            "startup_available + weights + KV + graphs, which misses the CUDA context"
        )
        return GpuMemory(known, "server: startup_available + weights + KV + graphs", False), notes
    if settings.gpus is not None:
        try:
            gpus = settings.gpus.snapshot()
            total = min(g.memory_total_gib for g in gpus)
            if info.tp_size > 1:
                # SGLang measures free memory after the TP communicators are set up, which
                # NVML's figure on an idle GPU does not see: the estimate is an upper bound.
                notes.append(
                    "GPU memory from NVML on an idle GPU overstates what SGLang measures at "
                    f"TP{info.tp_size} (its communicators take some first): set gpu_memory_gib "
                    "or run SGLang 0.5.17+ (startup_available) for exact predictions"
                )
            return GpuMemory(
                total - CUDA_CONTEXT_GIB,
                f"NVML: {gpus[0].name}, {gpus[0].memory_total_mib} MiB, less "
                f"{CUDA_CONTEXT_GIB} GiB for the CUDA context",
                info.tp_size == 1,
                total_mib=min(g.memory_total_mib for g in gpus),
            ), notes
        except GpuUnavailable as exc:
            notes.append(f"GPU probe unavailable ({exc}); GPU memory estimated")
    notes.append(
        "GPU memory is not known (no configuration, no NVML, SGLang < 0.5.23): it is "
        "estimated from the server's own split, so capacity predictions for a new "
        "mem_fraction_static are approximate. Set gpu_memory_gib for exact ones."
    )
    return None, notes


def before_load_from_split(
    free_after_start: float, graphs: float, weights_and_pool: float, fraction: float
) -> tuple[str, float]:
    """The GPU memory SGLang measured before loading the weights (`pre`), from its own report
    of an uncapped pool: (which figure, GiB).

    SGLang sizes the pool so that the weights, the pool and what it allocates inside the static
    budget take `fraction * pre`; the rest, `(1 - fraction) * pre`, holds the CUDA graphs, what
    is free after start-up (`startup_available`) and allocations `memory_usage` does not list
    (0.5.17 on an H100: 1.11-1.20 GiB of eager buffers at every fraction). So each figure below
    misses something and is a lower bound, and the largest is the closest:

    * (startup_available + graphs) / (1 - fraction) misses the unlisted allocations, an error
      that grows as the fraction rises (0.5.17, H100: 10% low at 0.85, 2.4% at 0.40);
    * (weights + KV) / fraction misses static allocations besides the pool, an error that grows
      as the fraction falls (the same server: within 0.13% at both);
    * their sum misses both.
    Overstating `pre` would overstate capacity and activation room, so no figure that can be
    above it is taken: NVML's total is, by the CUDA context and whatever SGLang's start took."""
    bounds = {
        "(startup_available + graphs) / (1 - mem_fraction_static)": (free_after_start + graphs)
        / (1 - fraction),
        "(weights + KV) / mem_fraction_static": weights_and_pool / fraction,
        "startup_available + graphs + weights + KV": free_after_start + graphs + weights_and_pool,
    }
    source, pre = max(bounds.items(), key=lambda item: item[1])
    return f"{source}, the largest of three lower bounds", pre


def _nvml_total(settings: DiagnoseSettings) -> float | None:
    """The GPUs' total memory in MiB where they are local (SGLang's defaults read it)."""
    if settings.gpus is None:
        return None
    try:
        return float(min(g.memory_total_mib for g in settings.gpus.snapshot()))
    except GpuUnavailable:
        return None


def effective_kv_dtype(info: ServerInfo, geometry: Geometry | None, bytes_per_token: float) -> str:
    """The dtype the pool really uses: `auto` on an FP8 checkpoint is FP8, which the server's
    arguments do not say but the model's config and the pool's own bytes per token do."""
    named = str(info.arg("kv_cache_dtype") or "auto")
    if named != "auto" or geometry is None:
        return named
    attn_tp = max(1, info.tp_size // attn_dp_size(info))
    if geometry.kv_quant_fp8:
        return "fp8_e4m3"
    # A hybrid pool's bytes per token mix pools, so only a plain one says its element size.
    if not geometry.hybrid and geometry.pool_elem_bytes(bytes_per_token, attn_tp) < 1.5:
        return "fp8_e4m3"
    return named


DEFAULT_MAMBA_FULL_MEMORY_RATIO = 0.9  # fields/memory.py mamba_full_memory_ratio


def kv_share(info: ServerInfo, geometry: Geometry | None) -> float:
    """1 for attention-only models; 1/(1+r) where a mamba state cache takes r of every GiB."""
    if geometry is None or not geometry.linear_layers or info.arg("max_mamba_cache_size"):
        return 1.0
    ratio = info.arg("mamba_full_memory_ratio")
    r = float(ratio) if isinstance(ratio, (int, float)) else DEFAULT_MAMBA_FULL_MEMORY_RATIO
    return 1 / (1 + r)


def capacity_model(
    info: ServerInfo, fraction: float, gpu: GpuMemory | None, geometry: Geometry | None = None
) -> CapacityModel:
    """The capacity arithmetic fed from the server's own report."""
    cap = build_model(
        mem_fraction_static=fraction,
        max_total_num_tokens=info.max_total_num_tokens,
        kvcache_gb=info.memory.kvcache_gb,
        token_capacity=info.memory.token_capacity,
        weights_gb=info.memory.weight_gb,
        graph_gb=info.memory.graph_gb,
        gpu=gpu,
        page_size=int(info.arg("page_size") or 1),
        max_total_tokens_cap=info.arg("max_total_tokens"),
        kv_dtype=str(info.arg("kv_cache_dtype") or "auto"),
        free_now_gib=info.memory.startup_available_gb,
        geometry=geometry,
        hicache_on=bool(info.arg("enable_hierarchical_cache")),
        kv_share=kv_share(info, geometry),
    )
    gpu_mib = cap.gpu.total_mib or (cap.gpu.pre_gib + CUDA_CONTEXT_GIB) * 1024
    deployment = deployment_of(info, gpu_mib, parse_version(info.version), geometry)
    return replace(
        cap,
        reserve=sglang_reserve(deployment),
        deployment=deployment,
        mla=deployment.mla,
        graphs_inside=deployment.post_capture and not deployment.mla,
        kv_dtype=effective_kv_dtype(info, geometry, cap.bytes_per_token),
        prefill_graph_gate_gib=prefill_graph_gate(info),
        prefill_graph_gib=info.memory.prefill_graph_gb or 0.0,
    )


PREFILL_GRAPH_GATE_GIB = 4.0  # 0.5.16-0.5.17 `_MIN_AUTO_PREFILL_CUDA_GRAPH_FREE_MEMORY_GB`


def prefill_graph_gate(info: ServerInfo) -> float | None:
    """The free memory below which this release skips its prefill CUDA graph, if it does: only
    0.5.16 and 0.5.17 (read in their wheels), and only while the graph is SGLang's own choice
    (an explicit prefill backend overrides the rule) and the per-phase report says which."""
    version = parse_version(info.version)
    if not ((0, 5, 16) <= version[:3] < (0, 5, 18)) or info.memory.prefill_graph_gb is None:
        return None
    if info.arg("cuda_graph_backend_prefill") or info.arg("disable_cuda_graph"):
        return None
    return PREFILL_GRAPH_GATE_GIB


def model_geometry(info: ServerInfo, settings: DiagnoseSettings) -> Geometry | None:
    if settings.models is None:
        return None
    config = settings.models.read(info.model)
    return geometry_of(config) if config is not None else None


PARTS = kit.Parts(analyse, propose, evaluate, judge_change, requests_fitting)


class ServerRules(kit.ServerRules[ServerInfo, CapacityModel, Context, Server]):
    """SGLang's rules for one server, its capacity model and host read before anything is
    measured (the skeleton: `playbooks.engines.kit.rules`); a server's facts carry the ranks on
    its host and its version, which decide how SGLang sizes the host pool."""

    parts = PARTS

    @property
    def server(self) -> Server:
        info = self.info
        return Server(info, self.cap, self.host, ranks_on_host(info), parse_version(info.version))

    def context(self, m: Measurement) -> Context:
        s = self.server
        return Context(s.info, m, s.cap, s.host, s.ranks_on_host, s.version)

    def capacity(self) -> kit.Capacity:
        return kit.Capacity(self.cap.bytes_per_token, self.cap.gpu.pre_gib, self.cap.gpu.source)

    def apart(self, ctx: Context) -> tuple[list[str], str] | None:
        """A disaggregated node: what was measured, and why nothing is proposed."""
        role = pd_role(ctx.info)
        if role is None:
            return None
        why = not_judged(role, "SGLang --disaggregation-mode", PD_NEEDS)
        return measured_evidence(ctx)[:1], why


def rules_for(
    info: ServerInfo, settings: DiagnoseSettings, *, measured: bool = True
) -> ServerRules:
    """`measured=False` (judging a change alone) assumes SGLang's default fraction if none is
    reported, where a diagnosis refuses to guess."""
    gpu, notes = resolve_gpu_memory(info, settings)
    fraction = info.mem_fraction_static
    if fraction is None and measured:
        raise ValueError("server info has no mem_fraction_static; is this SGLang?")
    fraction = 0.85 if fraction is None else fraction
    host = kit.host_memory(settings, notes)
    geometry = model_geometry(info, settings)
    if geometry is not None:
        notes.append(f"KV geometry from the model's config.json: {geometry.describe()}")
    cap = capacity_model(info, fraction, gpu, geometry)
    return ServerRules(info, cap, host, settings, notes)


def bottleneck_of(info: ServerInfo, m: Measurement) -> tuple[Bottleneck, list[str]] | str:
    """The bottleneck over stored measurements (no GPU or host probes), or why not."""
    fraction = info.mem_fraction_static
    if fraction is None:
        return "the server reports no mem_fraction_static; the day is not diagnosed"
    cap = capacity_model(info, fraction, None)
    return analyse(Context(info, m, cap, None, ranks_on_host(info), parse_version(info.version)))
