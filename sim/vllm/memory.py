"""vLLM's KV-cache sizing (v1 GPU worker), pure arithmetic.

The sizing functions named below live in `v1/core/kv_cache_utils.py` up to vLLM 0.32 and in
`v1/core/kv_cache_planning.py` from 0.33 (read in both wheels: the same arithmetic; the
capacity figures' `get_kv_cache_capacity` and `update_kv_cache_capacity` stay in
`kv_cache_utils.py`).

`gpu_memory_utilization` is the share of the GPU's TOTAL memory the instance may use for
everything (vllm/v1/worker/gpu_worker.py:634-790):

    requested   = ceil(total x utilization)                     (v1/worker/utils.py:716-772)
    non_kv      = weights + non-torch memory + activation peak of a max_num_batched_tokens run
    available   = requested - non_kv - CUDA-graph estimate      (no graphs with --enforce-eager)
    num_blocks  = available // (page_size x layers)             (get_kv_cache_config_from_groups)

`--kv-cache-memory-bytes` replaces `available`; `--num-gpu-blocks-override` replaces the block
count. A GQA page is `2 x block_size x kv_heads_per_rank x head_dim x dtype bytes` per layer; an
MLA page holds one latent (kv_lora_rank + qk_rope_head_dim) per token, the same on every rank
(vllm/v1/kv_cache_interface.py:511-560).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.vllm.args import GIB, VllmConfig, ceil_gib_bytes


class StartupError(Exception):
    """Start-up fails the way vLLM's engine core fails: exception type and message."""

    def __init__(self, message: str, exc_type: str = "ValueError") -> None:
        super().__init__(message)
        self.message = message
        self.exc_type = exc_type


def format_gib(nbytes: float) -> str:
    """vllm/utils/mem_utils.py:30: f"{round(b / GiB_bytes, 2)}"."""
    return f"{round(nbytes / GIB, 2)}"


def page_bytes_per_layer(cfg: VllmConfig) -> int:
    """Bytes of one KV block of one layer on one rank."""
    model = cfg.preset.model
    if model.is_mla:
        # MLAAttentionSpec: num_kv_heads 1, head_size kv_lora_rank + qk_rope_head_dim, no V.
        latent = model.kv_lora_rank + model.qk_rope_head_dim
        return int(cfg.block_size * latent * cfg.kv_dtype_bytes)
    heads = max(1, model.num_kv_heads // max(1, cfg.tensor_parallel_size))
    return int(2 * cfg.block_size * heads * model.head_dim * cfg.kv_dtype_bytes)


def bytes_per_block(cfg: VllmConfig) -> int:
    return page_bytes_per_layer(cfg) * cfg.preset.model.num_layers


@dataclass(frozen=True)
class KvPlan:
    requested_bytes: int
    weights_gib: float
    activation_gib: float
    non_torch_gib: float
    graph_gib: float
    available_bytes: int  # KV budget per GPU
    bytes_per_block: int
    num_gpu_blocks: int  # including the null block
    block_size: int
    kv_cache_size_tokens: int
    max_concurrency: float
    overridden_from: int | None = None  # the profiled block count an override replaced


def activation_peak_gib(cfg: VllmConfig) -> float:
    mem = cfg.preset.base.memory
    per_token = mem.activation_per_ktoken_gib / 1024
    return mem.activation_base_gib + per_token * cfg.max_num_batched_tokens


def plan_kv(cfg: VllmConfig) -> KvPlan:
    """Size the KV cache; raise StartupError with vLLM's message where vLLM refuses to start."""
    mem = cfg.preset.base.memory
    total_bytes = mem.gpu_memory_mib * (1 << 20)
    requested = ceil_gib_bytes(mem.gpu_memory_mib, cfg.gpu_memory_utilization)
    free = mem.free_before_load_gib * GIB
    if free < requested:
        # vllm/v1/worker/utils.py:761-770
        raise StartupError(
            f"Free memory on device cuda:0 ({free / GIB:.2f}/{total_bytes / GIB:.2f} GiB) on "
            "startup is less than desired GPU memory utilization "
            f"({cfg.gpu_memory_utilization}, {requested / GIB:.2f} GiB). Decrease GPU memory "
            "utilization or reduce GPU memory used by other processes."
        )
    activation = activation_peak_gib(cfg)
    graph = 0.0 if cfg.enforce_eager else mem.graph_gib
    if cfg.kv_cache_memory_bytes is not None:
        available = cfg.kv_cache_memory_bytes  # gpu_worker.py:647-671
    else:
        non_kv = (mem.weights_gib + mem.other_static_gib + activation) * GIB
        available = int(requested - non_kv - graph * GIB)
    per_block = bytes_per_block(cfg)
    overridden_from = None
    effective = available
    if cfg.num_gpu_blocks_override is not None:
        # get_kv_cache_configs: the override decides the memory planned against
        overridden_from = max(0, available) // per_block
        effective = cfg.num_gpu_blocks_override * per_block
    # get_kv_cache_configs: the null block is reserved before the capacity check
    check = effective - per_block
    _check_enough(cfg, check, per_block)
    num_blocks = effective // per_block
    blocks_per_request = math.ceil(cfg.max_model_len / cfg.block_size)
    # get_kv_cache_capacity: max_concurrency x max_model_len
    max_concurrency = num_blocks / blocks_per_request
    return KvPlan(
        requested_bytes=requested,
        weights_gib=mem.weights_gib,
        activation_gib=activation,
        non_torch_gib=mem.other_static_gib,
        graph_gib=graph,
        available_bytes=available,
        bytes_per_block=per_block,
        num_gpu_blocks=num_blocks,
        block_size=cfg.block_size,
        kv_cache_size_tokens=int(max_concurrency * cfg.max_model_len),
        max_concurrency=max_concurrency,
        overridden_from=overridden_from,
    )


def _check_enough(cfg: VllmConfig, available: int, per_block: int) -> None:
    """`_check_enough_kv_cache_memory` (v1/core/, module docstring)."""
    if available <= 0:
        raise StartupError(
            "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
            "when initializing the engine (this flag also controls CPU memory reservation on the "
            "CPU backend, despite its name). See "
            "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
        )
    needed = math.ceil(cfg.max_model_len / cfg.block_size) * per_block
    if needed <= available:
        return
    # estimate_max_model_len: the largest length whose blocks fit (binary search in vLLM)
    estimated = min(cfg.max_model_len, (available // per_block) * cfg.block_size)
    estimated_msg = (
        f"Based on the available memory, the estimated maximum model length is {estimated}. "
        if estimated > 0
        else ""
    )
    raise StartupError(
        "To serve at least one request with the model's max seq len "
        f"({cfg.max_model_len}), ({format_gib(needed)} GiB KV cache is needed, which is larger "
        f"than the available KV cache memory ({format_gib(available)} GiB). {estimated_msg}"
        "Try increasing `gpu_memory_utilization` (which also controls CPU memory on the CPU "
        "backend) or decreasing `max_model_len` when initializing the engine. See "
        "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
    )


def engine_name(cfg: VllmConfig, index: int) -> str:
    """The engine core's process name (v1/engine/utils.py: `EngineCore_DP{i}` under DP)."""
    return f"EngineCore_DP{index}" if cfg.data_parallel_size > 1 else "EngineCore"


def offload_pinned_bytes(cfg: VllmConfig) -> int:
    """The host memory one engine pins for KV offloading: the whole `--kv-offloading-size`
    (config/vllm.py hands every engine's connector `cpu_bytes_to_use` = size x 2**30, and
    v1/kv_offload/cpu/spec.py splits it only over that engine's TP x PP workers)."""
    return int((cfg.kv_offloading_size or 0) * GIB)


def engine_killed_by_host_oom(cfg: VllmConfig) -> int | None:
    """The engine whose pinning passes the host's free memory, which the kernel's OOM killer
    ends (SIGKILL); None when every engine's fits. The twin's host has `host_ram_gib` less
    what else it runs (the preset's `host_other_gib`)."""
    per_engine = offload_pinned_bytes(cfg)
    if not per_engine:
        return None
    free = (cfg.host_ram_gib - cfg.preset.base.host_other_gib) * GIB
    for index in range(cfg.data_parallel_size):
        if (index + 1) * per_engine > free:
            return index
    return None


def kv_size_line(plan: KvPlan, max_model_len: int) -> str:
    """`update_kv_cache_capacity` (kv_cache_utils.py:2327 in 0.32), one line."""
    return (
        f"GPU KV cache size: {plan.kv_cache_size_tokens:,} tokens, Maximum concurrency for "
        f"{max_model_len:,} tokens per request: {plan.max_concurrency:.2f}x"
    )
