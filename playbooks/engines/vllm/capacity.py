"""vLLM's KV-cache memory arithmetic, and capacity predicted from the running server's own figure.

The sizing functions named below live in `v1/core/kv_cache_utils.py` up to vLLM 0.32 and in
`v1/core/kv_cache_planning.py` from 0.33 (read in both wheels: the same arithmetic; the
capacity figures' `get_kv_cache_capacity` and `update_kv_cache_capacity` stay in
`kv_cache_utils.py`).

How vLLM sizes the KV cache, per GPU (v1/worker/gpu_worker.py:634-790,
`Worker.determine_available_memory`; v1/worker/utils.py:716-772, `request_memory`):

    requested = ceil(total_memory * gpu_memory_utilization)
    KV bytes  = requested - non_kv - cuda_graphs
    non_kv    = weights + persistent torch + non-torch (NCCL, cuBLAS) + peak activations
                (a profiling forward pass of max_num_batched_tokens tokens, utils/mem_utils.py)
    blocks    = KV bytes // (page size of a block over its layers)
                (`get_kv_cache_config_from_groups`)
    tokens    = (blocks - 1) * block_size   (one block is the null block, v1/core/block_pool.py:877)

so `gpu_memory_utilization` is a share of the GPU's *total* memory for everything vLLM holds, not
a share for weights and KV as SGLang's `mem_fraction_static` is; since v0.21 the CUDA graphs'
estimated memory is inside it too (`VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`). What stays
outside is `(1 - u) * total`, the headroom for whatever the profile does not see (allocator
fragmentation, other processes, a CUDA context). Start-up fails if less than `requested` is free
(v1/worker/utils.py:761-770). With `--kv-cache-memory-bytes B` vLLM skips the sizing and takes B
per GPU whatever the utilization (gpu_worker.py:648-671).

The non-KV terms depend only on the model and `max_num_batched_tokens`, so a new utilization u'
moves the KV bytes by `(u' - u) * total` and nothing else; a dtype of half the size halves a
block's bytes. Predictions scale the server's reported blocks and tokens by that, rather than
recomputing them from scratch, so whatever vLLM rounded or reserved stays in the figure. Absolute
KV bytes need a block's size: from the model's config (`geometry.py`), or from the KV bytes flag.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from playbooks.engines.vllm.allow_list import FP8_DTYPES
from playbooks.engines.vllm.geometry import Geometry
from playbooks.sources.gpu import GpuState

GIB = 1 << 30
# Bytes per KV element (config/cache.py `CacheDType`; `auto` is the model's dtype, 16-bit for
# every model vLLM serves unless started with --dtype float32).
DTYPE_BYTES = {"auto": 2.0, "bfloat16": 2.0, "float16": 2.0, **dict.fromkeys(FP8_DTYPES, 1.0)}
DEFAULT_DTYPE_BYTES = 2.0
# Utilization ceilings. vLLM's own tuner (benchmarks/auto_tune/auto_tune.sh) searches from 0.98
# down for the highest value that starts without OOM: above it kvpilot calls a value unsafe.
# Up to 0.95 leaves at least 5% of the GPU outside vLLM's budget for what its profile does not
# see; between the two a value is possible, with that headroom named in numbers.
RECOMMENDED_UTILIZATION = 0.95
HIGHEST_UTILIZATION = 0.98


def dtype_bytes(dtype: str) -> float:
    return DTYPE_BYTES.get(dtype, DEFAULT_DTYPE_BYTES)


@dataclass(frozen=True)
class GpuMemory:
    """One GPU's total memory, the base of `--gpu-memory-utilization`."""

    total_gib: float
    source: str
    # NVML's reading of every GPU of the host, where the bot runs there: what is free now
    # bounds the utilization a restart can start with (`shared_gpu.py`)
    gpus: tuple[GpuState, ...] = ()


@dataclass(frozen=True)
class CapacityModel:
    """The running server's KV pool, and how it moves with a change (module docstring)."""

    utilization: float
    engines: int  # data-parallel engines, each with its own pool
    blocks: int | None  # one engine's blocks, the null block included
    block_size: int
    tokens: int  # usable KV tokens over all engines: the server's own figure
    kv_dtype: str  # the dtype the pool uses now ("auto" resolved where the config says)
    block_bytes: float | None = None  # one block on one GPU
    kv_bytes_flag: int | None = None  # --kv-cache-memory-bytes, per GPU
    gpu: GpuMemory | None = None
    geometry: Geometry | None = None
    max_model_len: int | None = None
    # --num-gpu-blocks-override: the pool has exactly this many blocks whatever the memory
    # (`get_kv_cache_configs`: "Overriding num_gpu_blocks=%d with num_gpu_blocks_override=%d")
    blocks_override: int | None = None

    @property
    def sized_by_bytes(self) -> bool:
        """vLLM took the KV size from --kv-cache-memory-bytes and ignored the utilization."""
        return self.kv_bytes_flag is not None

    @property
    def kv_gib(self) -> float | None:
        """The KV cache on one GPU now, where a block's bytes or the flag say it."""
        if self.blocks is not None and self.block_bytes is not None:
            return self.blocks * self.block_bytes / GIB
        if self.kv_bytes_flag is not None:
            return self.kv_bytes_flag / GIB
        return None

    @property
    def bytes_per_token(self) -> float:
        """KV bytes one token takes on one GPU (0 where kvpilot cannot say)."""
        if self.block_bytes is not None:
            return self.block_bytes / self.block_size
        return 0.0

    @property
    def non_kv_gib(self) -> float | None:
        """What vLLM's budget holds besides the KV cache: weights, peak activations, non-torch
        memory and CUDA graphs (known where the utilization sized the cache)."""
        kv = self.kv_gib
        if kv is None or self.gpu is None or self.sized_by_bytes:
            return None
        return self.utilization * self.gpu.total_gib - kv

    def headroom_gib(self, utilization: float) -> float | None:
        """GPU memory left outside vLLM's budget at `utilization`."""
        return None if self.gpu is None else (1 - utilization) * self.gpu.total_gib

    def kv_gib_after(self, utilization: float, kv_bytes: int | None = None) -> float | None:
        """The KV cache on one GPU after a change of utilization or of the KV bytes flag."""
        if kv_bytes is not None:
            return kv_bytes / GIB
        if self.sized_by_bytes or utilization == self.utilization:
            return self.kv_gib
        kv = self.kv_gib
        if kv is None or self.gpu is None:
            return None
        return kv + (utilization - self.utilization) * self.gpu.total_gib

    def blocks_after(
        self,
        utilization: float,
        dtype: str | None = None,
        block_size: int | None = None,
        kv_bytes: int | None = None,
    ) -> int | None:
        """One engine's blocks after a change (the null block included); None where kvpilot
        cannot predict it (no block size in bytes, or no GPU memory for a new utilization)."""
        if self.blocks is None:
            return None
        if self.blocks_override is not None:
            return self.blocks_override
        scale = dtype_bytes(dtype or self.kv_dtype) / dtype_bytes(self.kv_dtype)
        scale *= (block_size or self.block_size) / self.block_size
        moves_kv = kv_bytes is not None or (
            utilization != self.utilization and not self.sized_by_bytes
        )
        if not moves_kv:
            # the same KV bytes in blocks `scale` times the size
            return math.floor(self.blocks / scale)
        kv, per = self.kv_gib_after(utilization, kv_bytes), self.block_bytes
        if per is None and self.kv_bytes_flag is not None:
            per = self.kv_bytes_flag / self.blocks  # the blocks the flag's bytes made
        if kv is None or per is None:
            return None
        return max(0, math.floor(kv * GIB / (per * scale)))

    def tokens_after(
        self,
        utilization: float | None = None,
        dtype: str | None = None,
        block_size: int | None = None,
        kv_bytes: int | None = None,
    ) -> int | None:
        """Usable KV tokens over all engines after a change: today's figure scaled by the
        usable blocks (and their size), so vLLM's own rounding stays in it."""
        u = self.utilization if utilization is None else utilization
        blocks = self.blocks_after(u, dtype, block_size, kv_bytes)
        if blocks is None or self.blocks is None:
            return None
        now = max(1, self.blocks - 1) * self.block_size
        new = max(0, blocks - 1) * (block_size or self.block_size)
        return math.floor(self.tokens * new / now)

    def one_request_fits(self, tokens: int, max_model_len: int | None = None) -> bool:
        """Whether one engine's pool of (`tokens` over all engines) holds one request of the
        model's full length: vLLM refuses to start otherwise (`_check_enough_kv_cache_memory`, "To
        serve at least one request with the model's max seq len ...")."""
        length = max_model_len or self.max_model_len
        if not length or length < 0:
            return tokens > 0
        per_engine = tokens // max(1, self.engines)
        needed = math.ceil(length / self.block_size) * self.block_size
        return per_engine >= needed


def block_bytes_of(
    geometry: Geometry | None,
    block_size: int,
    kv_dtype: str,
    tp: int,
    blocks: int | None = None,
    kv_bytes_flag: int | None = None,
    overridden: bool = False,
) -> float | None:
    """A block's bytes on one GPU: from the model's geometry, else from the KV bytes flag and
    the blocks it made (vLLM divides the bytes by the block size, rounding down), unless an
    override set the blocks (`overridden`), when they say nothing of the bytes."""
    if geometry is not None:
        found = geometry.block_bytes(block_size, dtype_bytes(kv_dtype), tp)
        if found is not None:
            return found
    if kv_bytes_flag is not None and blocks and not overridden:
        return kv_bytes_flag / blocks
    return None
