"""Capacity arithmetic from the server's own report, and the safety rules for changes.

Inputs come from SGLang's server info (`mem_fraction_static`, `max_total_num_tokens`,
`memory_usage.{weight,kvcache,graph,token_capacity}`) plus the GPU's memory (NVML on the GPU host,
`startup_available` from SGLang 0.5.23, or configuration). SGLang sizes the pool as

    kv = mem_fraction_static * pre - static          (GiB per GPU)
    max_total_num_tokens = kv * 2**30 / bytes_per_token

where `pre` is the GPU memory free before the weights load. So a new fraction f' gives
`kv' = kv + (f' - f) * pre`, then the `--max-total-tokens` cap and page rounding; a KV dtype of
half the size doubles the tokens. What stays outside the weights and the pool is what the pool
really takes away: `(1 - f) * pre` for an uncapped pool, more where a cap holds the pool below
the fraction's budget, and SGLang 0.5.23 reports it after start-up (`startup_available` plus the
graphs). Activations get that less the CUDA graphs: SGLang's tuning guide asks for 5-8 GB, and
the incident's 0.93 (4.7 GiB left) ran out of memory. A fraction is recommended only where the
memory outside also covers SGLang's own reserve floor (`reserve.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from playbooks.engines.sglang.geometry import Geometry
from playbooks.engines.sglang.reserve import Deployment, Reserve, sglang_reserve

GIB = 1 << 30
ACTIVATION_FLOOR_GIB = 5.0  # SGLang's tuning guide: leave 5-8 GB for activations
SAFETY_MARGIN_GIB = 0.5
HICACHE_GPU_EXTRA_GIB = 0.5  # transfer buffers the hierarchical cache keeps on the GPU
HOST_RESERVE_GIB = 10.0  # SGLang keeps 10 GiB of host RAM free when sizing a host pool
HOST_MARGIN = 0.10  # and we keep 10% of what is left for everything else on the host
KV_DTYPE_BYTES = {
    "bf16": 2.0,
    "bfloat16": 2.0,
    "fp16": 2.0,
    "float16": 2.0,
    "auto": 2.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
}


@dataclass(frozen=True)
class GpuMemory:
    pre_gib: float  # free GPU memory before the weights load (per GPU)
    source: str  # where the figure came from
    exact: bool  # False when estimated from the split itself
    total_mib: float | None = None  # nvidia-smi's total, which SGLang's defaults read


@dataclass(frozen=True)
class CapacityModel:
    mem_fraction_static: float
    max_total_num_tokens: int
    bytes_per_token: float
    kv_gib: float
    weights_gib: float | None
    graph_gib: float
    gpu: GpuMemory
    page_size: int
    max_total_tokens_cap: int | None
    kv_dtype: str  # the dtype the pool uses now ("auto" = the model's)
    free_now_gib: float | None = None  # SGLang 0.5.23's startup_available: free once started
    reserve: Reserve | None = None  # SGLang's own default reserve for this GPU and deployment
    geometry: Geometry | None = None  # from the model's config.json, where kvpilot can read it
    hicache_on: bool = False  # the hierarchical cache's GPU buffers are already taken
    mla: bool = False  # the KV cell is a latent held whole on every TP rank
    # The share of a larger static budget the KV pool gets: hybrid mamba models give the rest
    # to their state cache, r/(1+r) of it with r = --mamba-full-memory-ratio
    # (`kv_cache_configurator.py::_handle_max_mamba_cache`).
    kv_share: float = 1.0
    graphs_inside: bool = False  # post-capture sizing: the graphs are part of the static pool
    deployment: Deployment | None = None  # what `reserve` was computed from
    # SGLang 0.5.16 and 0.5.17 capture no prefill CUDA graph where less than this is free after
    # the model, the pool and the eager buffers (`cuda_graph_setup.py`,
    # `should_skip_auto_prefill_cuda_graph_for_memory`, 4.0 GiB; 0.5.18 removed the rule):
    # the server starts and prefills without the graph. None on other releases.
    prefill_graph_gate_gib: float | None = None
    prefill_graph_gib: float = 0.0  # the prefill graph's share of `graph_gib` now

    def reserve_with(self, chunked_prefill_size: int | None = None) -> Reserve | None:
        """SGLang's default reserve for the deployment, with another prefill chunk if given:
        the 1.5 MB per chunk token term moves with it."""
        if chunked_prefill_size is None or self.deployment is None or self.reserve is None:
            return self.reserve
        return sglang_reserve(replace(self.deployment, chunked_prefill_size=chunked_prefill_size))

    @property
    def static_gib(self) -> float:
        return self.mem_fraction_static * self.gpu.pre_gib - self.kv_gib

    def budget_growth_gib(self, fraction: float) -> float:
        return (fraction - self.mem_fraction_static) * self.gpu.pre_gib

    def tokens_at(self, fraction: float, bytes_per_token: float | None = None) -> int:
        kv = self.kv_gib + self.budget_growth_gib(fraction) * self.kv_share
        if kv <= 0:
            return 0
        tokens = int(kv * GIB // (bytes_per_token or self.bytes_per_token))
        if self.max_total_tokens_cap is not None:
            tokens = min(tokens, self.max_total_tokens_cap)
        return tokens // self.page_size * self.page_size

    @property
    def outside_now_gib(self) -> float:
        """GPU memory outside the weights and the pool now, CUDA graphs included."""
        if self.free_now_gib is not None:
            # graphs captured inside the static pool (post-capture sizing) are not outside it
            return self.free_now_gib + (0.0 if self.graphs_inside else self.graph_gib)
        return (1 - self.mem_fraction_static) * self.gpu.pre_gib

    def outside_gib(
        self, fraction: float, bytes_per_token: float | None = None, hicache: bool = False
    ) -> float:
        """What stays outside the weights and the pool after a change: today's figure less what
        the pool really grows by (after the cap and page rounding) and the cache's buffers."""
        per = bytes_per_token or self.bytes_per_token
        pool = self.tokens_at(fraction, per) * per / GIB
        now = self.max_total_num_tokens * self.bytes_per_token / GIB
        extra = HICACHE_GPU_EXTRA_GIB if hicache and not self.hicache_on else 0.0
        return self.outside_now_gib - (pool - now) / self.kv_share - extra

    def prefill_graph_skipped(
        self, fraction: float, hicache: bool = False, bytes_per_token: float | None = None
    ) -> bool:
        """SGLang will start at `fraction` without its prefill CUDA graph (0.5.16-0.5.17)."""
        gate = self.prefill_graph_gate_gib
        return gate is not None and self.outside_gib(fraction, bytes_per_token, hicache) < gate

    def graphs_at(
        self, fraction: float, hicache: bool = False, bytes_per_token: float | None = None
    ) -> float:
        """The CUDA graphs' memory outside the pool at `fraction`: today's, less the prefill
        graph where SGLang will skip it. (Where today's server skipped it and the fraction
        leaves room for it, its size is not known here: `prefill_graph_returns` says so.)"""
        if self.graphs_inside:
            return 0.0
        if self.prefill_graph_skipped(fraction, hicache, bytes_per_token):
            return self.graph_gib - self.prefill_graph_gib
        return self.graph_gib

    def prefill_graph_returns(self, fraction: float, hicache: bool = False) -> bool:
        """Today's server skipped its prefill graph and `fraction` leaves room to capture it."""
        return (
            self.prefill_graph_gate_gib is not None
            and self.prefill_graph_gib == 0.0
            and not self.prefill_graph_skipped(fraction, hicache)
        )

    def activation_room_gib(
        self, fraction: float, hicache: bool = False, bytes_per_token: float | None = None
    ) -> float:
        graphs = self.graphs_at(fraction, hicache, bytes_per_token)
        return self.outside_gib(fraction, bytes_per_token, hicache) - graphs

    @staticmethod
    def _highest(holds: Callable[[float], bool]) -> float:
        """Highest fraction (two decimals) for which `holds`; the rooms it is asked about never
        grow with the fraction (above SGLang's prefill-graph gate they shrink again), so the
        first from the top is it."""
        for step in range(99, 0, -1):
            if holds(step / 100):
                return step / 100
        return 0.0

    def _max_fraction(self, need_outside_gib: float, hicache: bool) -> float:
        """Highest fraction keeping `need_outside_gib` outside the pool."""
        return self._highest(lambda f: self.outside_gib(f, hicache=hicache) >= need_outside_gib)

    def safe_max_fraction(self, hicache: bool = False) -> float:
        """Highest fraction that leaves the activation floor after the CUDA graphs."""
        need = ACTIVATION_FLOOR_GIB + SAFETY_MARGIN_GIB
        return self._highest(lambda f: self.activation_room_gib(f, hicache) >= need)

    def recommended_max_fraction(
        self, hicache: bool = False, chunked_prefill_size: int | None = None
    ) -> float:
        """Highest fraction that also keeps SGLang's own default reserve outside the pool (for
        the deployment with `chunked_prefill_size`, where given): what SGLang itself would
        choose, so a recommendation starts from its rule, not from kvpilot's model of the peak."""
        reserve = self.reserve_with(chunked_prefill_size)
        keep = reserve.total_gib if reserve is not None else 0.0
        return min(self.safe_max_fraction(hicache), self._max_fraction(keep, hicache))

    def min_fraction(self) -> float:
        """Below this the weights leave no room for any KV cache (SGLang refuses to start)."""
        return self.static_gib / self.gpu.pre_gib


def build_model(
    *,
    mem_fraction_static: float,
    max_total_num_tokens: int,
    kvcache_gb: float | None,
    token_capacity: int | None,
    weights_gb: float | None,
    graph_gb: float | None,
    gpu: GpuMemory | None,
    page_size: int,
    max_total_tokens_cap: int | None,
    kv_dtype: str,
    fallback_bytes_per_token: float | None = None,
    free_now_gib: float | None = None,
    reserve: Reserve | None = None,
    geometry: Geometry | None = None,
    hicache_on: bool = False,
    kv_share: float = 1.0,
) -> CapacityModel:
    """Assemble the model; estimate GPU memory when no better source exists (and say so)."""
    tokens = token_capacity or max_total_num_tokens
    if kvcache_gb is not None and tokens:
        bytes_per_token = kvcache_gb * GIB / tokens
        kv_gib = kvcache_gb
    elif fallback_bytes_per_token:
        bytes_per_token = fallback_bytes_per_token
        kv_gib = tokens * bytes_per_token / GIB
    else:
        raise ValueError(
            "the server reports no KV cache size (memory_usage.kvcache); cannot "
            "derive bytes per token"
        )
    if gpu is None:
        # The static budget f * pre holds at least the weights and the pool: pre >= (W + KV) / f.
        static = (weights_gb or 0.0) + kv_gib
        gpu = GpuMemory(
            static / mem_fraction_static, "estimated as (weights + KV) / fraction", exact=False
        )
    return CapacityModel(
        mem_fraction_static=mem_fraction_static,
        max_total_num_tokens=max_total_num_tokens,
        bytes_per_token=bytes_per_token,
        kv_gib=kv_gib,
        weights_gib=weights_gb,
        graph_gib=graph_gb if graph_gb is not None else 2.0,
        gpu=gpu,
        page_size=max(1, page_size),
        max_total_tokens_cap=max_total_tokens_cap,
        kv_dtype=kv_dtype,
        free_now_gib=free_now_gib,
        reserve=reserve,
        geometry=geometry,
        hicache_on=hicache_on,
        kv_share=kv_share,
    )


@dataclass(frozen=True)
class HostBudget:
    ranks_on_host: int
    host_total_gib: float
    host_available_gib: float
    per_rank_budget_gib: float  # what each rank may pin, all ranks together fitting with margin

    @classmethod
    def of(cls, total_gib: float, available_gib: float, ranks: int) -> HostBudget:
        usable = max(0.0, (available_gib - HOST_RESERVE_GIB) * (1 - HOST_MARGIN))
        return cls(ranks, total_gib, available_gib, usable / max(1, ranks))

    def pinned_total_gb(self, per_rank_gb: float) -> float:
        return per_rank_gb * self.ranks_on_host
