"""SGLang's memory arithmetic: defaults, KV-pool capacity, request pool, host pool, OOM headroom.

Pure functions of a preset and resolved arguments, so they can be unit-tested against the numbers
in the reference notes and reused by anything that predicts capacity. Failures raise
`StartupFailure` carrying the exact message SGLang prints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.presets import GIB, Preset
from sim.shapes import KvShape, dp_attention_graph_reserve_mib
from sim.version import SGLangVersion

CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
HOST_RESERVE_BYTES = 10 * GIB  # SGLang keeps 10 GiB of host RAM free when sizing the host pool


class StartupFailure(Exception):
    """The server cannot start; `exc_type` and the message are what SGLang's traceback ends with."""

    def __init__(self, exc_type: str, message: str, stage: str) -> None:
        super().__init__(message)
        self.exc_type = exc_type
        self.message = message
        self.stage = stage


@dataclass(frozen=True)
class GpuDefaults:
    chunked_prefill_size: int
    cuda_graph_max_bs: int


def gpu_defaults(version: SGLangVersion, gpu_memory_mib: int, tp_size: int) -> GpuDefaults:
    """`_handle_gpu_memory_settings`: chunked prefill and CUDA-graph batch size by GPU memory."""
    gib = gpu_memory_mib / 1024
    small_bucket_chunk = 4096 if version.refactored else 2048
    if gib < 20:
        return GpuDefaults(2048, 8)
    if gib < 35:
        big = 48 if version.refactored else 24
        return GpuDefaults(small_bucket_chunk, big if tp_size < 4 else 80)
    if gib < 60:
        return GpuDefaults(4096, 32 if tp_size < 4 else 160)
    if gib < 90:
        return GpuDefaults(8192, 256 if tp_size < 4 else 512)
    if gib < 160:
        return GpuDefaults(8192, 256 if tp_size < 4 else 512)
    return GpuDefaults(16384, 512)


def default_mem_fraction_static(
    version: SGLangVersion,
    gpu_memory_mib: int,
    tp_size: int,
    pp_size: int,
    chunked_prefill_size: int,
    cuda_graph_max_bs: int,
    is_mla: bool,
    multimodal: bool,
    cuda_graphs: bool = True,
    attn_dp_size: int = 1,
) -> float:
    """The reserve heuristic that picks `mem_fraction_static` when the operator gives none.

    From 0.5.23 the CUDA-graph part of the reserve is dropped when graphs are disabled; the part
    DP attention adds is kept (arg_groups/memory_hook.py::reserve_for_graph_mb).
    """
    activation_tokens = max(chunked_prefill_size, 2048)
    graph_mib: float = cuda_graph_max_bs * 2
    if version.refactored:
        graph_mib += 1536 if is_mla else 8 * 8  # prefill CUDA graph reserve
        if not cuda_graphs:
            graph_mib = 0
        graph_mib += dp_attention_graph_reserve_mib(cuda_graph_max_bs, attn_dp_size)
    reserve_mib = 512 + activation_tokens * 1.5 + graph_mib + tp_size * pp_size / 8 * 1024
    if gpu_memory_mib > 60 * 1024:
        reserve_mib = max(reserve_mib, 10240)
    # SGLang lowers the value further for vision-language models (adjust_mem_fraction_for_vlm);
    # the twin does not model that adjustment, so `multimodal` is accepted but unused.
    del multimodal
    return round((gpu_memory_mib - reserve_mib) / gpu_memory_mib, 3)


@dataclass(frozen=True)
class Capacity:
    """The KV pool as `ModelRunner.init_memory_pool` would size it on one GPU."""

    pre_gib: float  # free before weights (minimum over ranks)
    avail_gib: float  # free after weights
    rest_gib: float  # budget for the KV pool
    cell_size: int  # bytes per token per GPU
    profiled_tokens: int
    max_total_num_tokens: int
    kv_cache_gib: float
    warnings: tuple[str, ...]
    swa_tokens: int | None = None  # the sliding-window pool of a hybrid SWA model


def plan_capacity(
    preset: Preset,
    version: SGLangVersion,
    mem_fraction_static: float,
    kv_dtype: str,
    attention_tp: int,
    page_size: int,
    max_total_tokens: int | None,
    shape: KvShape | None = None,
) -> Capacity:
    """`rest = avail - pre * (1 - mem_fraction_static)`; tokens = rest / cell, capped, rounded.

    `shape` (default: the model's full-attention cell) prices a token of `max_total_num_tokens`;
    for a hybrid SWA model that is a full-pool row plus the ratio's share of an SWA row.
    """
    mem = preset.memory
    pre = mem.free_before_load_gib
    static = mem.weights_gib + mem.other_static_gib
    if mem.weights_gib > pre:
        raise StartupFailure(
            "torch.OutOfMemoryError",
            f"CUDA out of memory. Tried to allocate {mem.weights_gib - pre + 0.5:.2f} GiB. GPU 0 "
            f"has a total capacity of {mem.gpu_memory_mib / 1024:.2f} GiB of which 0 bytes is "
            "free.",
            "load_weight",
        )
    avail = pre - static
    rest = avail - pre * (1 - mem_fraction_static)
    shape = shape or KvShape(full_cell=preset.model.cell_size(kv_dtype, attention_tp))
    cell = shape.full_cell
    if rest <= 0:
        if version.refactored:
            needed = math.ceil((1 - avail / pre) * 100) / 100
            msg = (
                "Loaded weights leave no GPU memory for the KV cache under "
                f"--mem-fraction-static={mem_fraction_static}. Raise --mem-fraction-static "
                f"above {needed:.2f}"
            )
        else:
            msg = "Not enough memory. Please try to increase --mem-fraction-static."
        raise StartupFailure("RuntimeError", msg, "memory_pool")
    profiled = int(rest * GIB // shape.profile_cell)
    tokens = profiled
    warnings: list[str] = []
    if max_total_tokens is not None:
        if max_total_tokens > profiled:
            warnings.append(
                f"max_total_tokens={max_total_tokens} is larger than the profiled value "
                f"{profiled}. Use the profiled value instead."
            )
        tokens = min(profiled, max_total_tokens)
    tokens = tokens // page_size * page_size
    if tokens <= 0:
        raise StartupFailure(
            "RuntimeError",
            "Not enough memory. Please try to increase --mem-fraction-static.",
            "memory_pool",
        )
    return Capacity(
        pre_gib=pre,
        avail_gib=avail,
        rest_gib=rest,
        cell_size=cell,
        profiled_tokens=profiled,
        max_total_num_tokens=tokens,
        # SGLang's pool holds one page of padding rows on top of its tokens.
        kv_cache_gib=shape.pool_bytes(tokens, page_size) / GIB,
        warnings=tuple(warnings),
        swa_tokens=shape.swa_tokens(tokens, page_size) if shape.hybrid else None,
    )


def request_pool_size(max_total_num_tokens: int, context_len: int) -> int:
    """The request-pool estimate: clamp(int(tokens / context * 512), 2048, 4096)."""
    return min(4096, max(2048, int(max_total_num_tokens / context_len * 512)))


def effective_max_running_requests(
    max_total_num_tokens: int, context_len: int, user_value: int | None, attn_dp_size: int
) -> int:
    """What one scheduler admits at most (not the user value echoed in server args).

    mem_cache/kv_cache_configurator.py::resolve_max_num_reqs: the global `--max-running-requests`
    is divided by the attention-DP width and capped by half the pool; without it the request-pool
    estimate applies, also capped by half the pool.
    """
    if user_value is None:
        return min(request_pool_size(max_total_num_tokens, context_len), max_total_num_tokens // 2)
    return min(max(1, user_value // max(1, attn_dp_size)), max_total_num_tokens // 2)


def max_req_input_len(context_len: int, max_total_num_tokens: int) -> int:
    return min(context_len - 1, max_total_num_tokens - 1) - 5


@dataclass(frozen=True)
class HostPool:
    """The hierarchical cache's host pool, per rank and for the whole host."""

    tokens_per_rank: int
    bytes_per_rank: int
    ranks_on_host: int
    total_bytes: int
    host_available_bytes: int
    will_oom_host: bool  # passes SGLang's check but overcommits pinned RAM (old versions)
    ratio_used: float
    log_lines: tuple[str, ...]

    @property
    def pin_s(self) -> float:
        """Simulated seconds to allocate and pin the pool: every rank pins its own at once."""
        return self.bytes_per_rank / PIN_BYTES_PER_S


# SGLang allocates the host pool pinned (`torch.empty(..., pin_memory=True)`,
# mem_cache/memory_pool_host.py `init_kv_buffer`); on the H100 of gpu-sglang.md pinning 35.09 GB
# took about 31 s (start-up 83-86 s with HiCache ratio 2 against 37-54 s without).
PIN_BYTES_PER_S = 35.09e9 / 31.0


def plan_host_pool(
    preset: Preset,
    version: SGLangVersion,
    device_tokens: int,
    cell_size: int,
    page_size: int,
    ranks_on_host: int,
    hicache_ratio: float | None,
    hicache_size_gb: float,
    host_ram_gib: float,
) -> HostPool:
    """`HostKVCache.__init__`: size the pool, then run the version's host-memory check."""
    available = int((host_ram_gib - preset.host_other_gib) * GIB)
    budget_per_rank = max(0, (available - HOST_RESERVE_BYTES) // max(1, ranks_on_host))
    logs: list[str] = []
    ratio = hicache_ratio
    # mem_cache/hicache_auto_size.py, in the wheels from 0.5.21 on
    if version.at_least("0.5.21") and ratio is None and hicache_size_gb <= 0:
        device_bytes = device_tokens * cell_size
        auto = min(2.0, 0.95 * budget_per_rank * 0.8 / max(1, device_bytes))
        if auto <= 0:
            raise StartupFailure(
                "ValueError",
                "No host memory is left for HiCache after the 10 GiB reserve",
                "hicache",
            )
        logs.append(
            f"HiCache auto-sizing: ratio 2.0 -> {auto:.2f}; budget per rank "
            f"{budget_per_rank / 1e9:.2f} GB"
        )
        ratio = auto
    if ratio is None:
        ratio = 2.0
    if hicache_size_gb > 0:
        tokens = int(hicache_size_gb * 1e9 // cell_size)
    else:
        tokens = int(device_tokens * ratio)
    tokens = (tokens // page_size + 1) * page_size
    requested = tokens * cell_size
    if tokens <= device_tokens:
        if not version.refactored:
            raise StartupFailure(
                "AssertionError",
                "The host memory should be larger than the device memory with the current "
                f"protocol, but got host {tokens} tokens <= device {device_tokens} tokens. "
                "Increase --hicache-ratio or --hicache-size.",
                "hicache",
            )
        logs.append(
            f"HiCache host pool ({tokens} tokens) is smaller than the device pool "
            f"({device_tokens} tokens)."
        )
    limit = budget_per_rank if version.refactored else available - HOST_RESERVE_BYTES
    if requested > limit:
        raise StartupFailure(
            "ValueError",
            f"Not enough host memory available. Requesting {requested / 1e9:.2f} GB but only have "
            f"{limit / 1e9:.2f} GB free. Please reduce the size of the hierarchical cache.",
            "hicache",
        )
    total = requested * ranks_on_host
    if version.refactored:
        logs.append(
            f"Allocating kv hierarchical KV host pool: {tokens} tokens, "
            f"{requested / 1e9:.2f} GB host memory."
        )
    else:
        logs.append(f"Allocating {requested / 1e9:.2f} GB host memory for hierarchical KV cache.")
    return HostPool(
        tokens_per_rank=tokens,
        bytes_per_rank=requested,
        ranks_on_host=ranks_on_host,
        total_bytes=total,
        host_available_bytes=available,
        will_oom_host=total > available,
        ratio_used=ratio,
        log_lines=tuple(logs),
    )


@dataclass(frozen=True)
class Headroom:
    """GPU memory left for activations after the static pool and CUDA graphs."""

    reserve_gib: float  # pre * (1 - mem_fraction_static)
    graph_gib: float
    activation_gib: float  # what is left for a batch's activations
    prefill_graph_skipped: bool = False  # SGLang 0.5.16-0.5.17 with less than 4 GiB free

    def batch_fits(self, preset: Preset, tokens_in_batch: int) -> bool:
        return activation_need_gib(preset, tokens_in_batch) <= self.activation_gib


def activation_need_gib(preset: Preset, tokens_in_batch: int) -> float:
    """What a batch of this many tokens really needs: the modelled activations times the
    preset's hidden `activation_peak_scale` (1 unless the twin was told otherwise)."""
    return modelled_activation_gib(preset, tokens_in_batch) * preset.memory.activation_peak_scale


def modelled_activation_gib(preset: Preset, tokens_in_batch: int) -> float:
    """The modelled activations of a batch: a base plus a share per thousand tokens."""
    mem = preset.memory
    return mem.activation_base_gib + mem.activation_per_ktoken_gib * tokens_in_batch / 1000


def headroom(
    preset: Preset,
    mem_fraction_static: float,
    hicache: bool,
    kv_cache_gib: float | None = None,
    version: SGLangVersion | None = None,
) -> Headroom:
    """Memory left after weights, other static memory and the KV pool, then after CUDA graphs.

    Without `--max-total-tokens` the pool takes its whole budget and the rest is exactly
    `pre * (1 - mem_fraction_static)`; a capped (smaller) pool leaves more.
    """
    mem = preset.memory
    reserve = mem.free_before_load_gib * (1 - mem_fraction_static)
    if kv_cache_gib is not None:
        static = mem.weights_gib + mem.other_static_gib
        reserve = max(reserve, mem.free_before_load_gib - static - kv_cache_gib)
    skipped = version is not None and skips_prefill_graph(version, reserve)
    graphs = (
        mem.graph_gib
        - (mem.prefill_graph_gib if skipped else 0.0)
        + (mem.hicache_extra_gib if hicache else 0.0)
    )
    return Headroom(
        reserve_gib=reserve,
        graph_gib=graphs,
        activation_gib=reserve - graphs,
        prefill_graph_skipped=skipped,
    )


# SGLang 0.5.16 and 0.5.17 capture no prefill CUDA graph with less than this free after the
# model, the KV pool and the eager buffers, and start without it
# (`model_runner_components/cuda_graph_setup.py`, `_MIN_AUTO_PREFILL_CUDA_GRAPH_FREE_MEMORY_GB`;
# 0.5.18 removed the rule). On an H100 the real 0.5.17 did so at 0.95 (3.67 GiB free) and 0.97.
PREFILL_GRAPH_GATE_GIB = 4.0


def skips_prefill_graph(version: SGLangVersion, free_gib: float) -> bool:
    return (
        version.at_least("0.5.16")
        and not version.at_least("0.5.18")
        and free_gib < PREFILL_GRAPH_GATE_GIB
    )
