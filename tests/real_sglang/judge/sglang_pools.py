"""The KV pool and the HiCache host pool, sized by SGLang's own configurator code.

``ModelRunner.init_kv_cache_configurator`` (model_executor/model_runner.py) builds a
``KVCacheConfigurator`` from a loaded model; here the same fields come from the same helper
functions, with a stand-in for the model (below). The pool sizes then come from
``KVCacheConfigurator._resolve_memory_pool_config`` (mem_cache/kv_cache_configurator.py):
``_profile_available_bytes`` -> ``config_from_budget`` (``create_memory_pool_configurator(...)
.calculate_pool_sizes``, model_executor/pool_configurator.py) -> ``resolve_max_num_reqs`` ->
``finalize_with_max_running_requests``. No tensor is allocated.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from sglang.srt.configs.load_config import LoadConfig  # type: ignore[import-not-found]
from sglang.srt.configs.model_config import AttentionArch, ModelConfig  # type: ignore[import-not-found]
from sglang.srt.mem_cache import hicache_auto_size  # type: ignore[import-not-found]
from sglang.srt.mem_cache import kv_cache_configurator as kvc_module
from sglang.srt.mem_cache.kv_cache_dtype import configure_kv_cache_dtype  # type: ignore[import-not-found]
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool  # type: ignore[import-not-found]
from sglang.srt.mem_cache.pool_host.base import (  # type: ignore[import-not-found]
    HostKVCache,
    host_memory_budget_bytes,
)
from sglang.srt.model_executor.model_runner_components.layer_setup import (  # type: ignore[import-not-found]
    resolve_layer_indices,
)
from sglang.srt.model_executor.model_runner_components.load_model_utils import (  # type: ignore[import-not-found]
    resolve_sliding_window_size,
)
from sglang.srt.model_executor.model_runner_components.spec_aux_hidden_state import (  # type: ignore[import-not-found]
    resolve_spec_aux_hidden_state_config,
)
from sglang.srt.model_executor.pool_configurator import create_memory_pool_configurator  # type: ignore[import-not-found]
from sglang.srt.model_loader.loader import _get_quantization_config  # type: ignore[import-not-found]
from sglang.srt.runtime_context import get_memory, get_parallel, get_schedule  # type: ignore[import-not-found]
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # type: ignore[import-not-found]


def stand_in_model(model_config: ModelConfig) -> Any:
    """FAKE: the loaded ``nn.Module``. The KV sizing reads only its ``quant_config`` (for
    ``kv_cache_quant_algo``, mem_cache/kv_cache_dtype.py), built here by the loader's own
    ``_get_quantization_config`` (model_loader/loader.py) from the checkpoint's config. It has
    no ``start_layer``/``end_layer`` (one PP stage owns every layer) and no
    ``get_attention_sliding_window_size`` (the window comes from the model config)."""
    quant_config = None
    if model_config.quantization is not None:
        quant_config = _get_quantization_config(model_config, LoadConfig(load_format="dummy"))
    return types.SimpleNamespace(quant_config=quant_config)


def build_configurator(server_args: Any, model_config: ModelConfig) -> Any:
    """``KVCacheConfigurator`` as ``ModelRunner.init_kv_cache_configurator`` fills it."""
    model = stand_in_model(model_config)
    spec_algorithm = SpeculativeAlgorithm.from_string(server_args.speculative_algorithm)
    resolved_dtype, kv_cache_dtype = configure_kv_cache_dtype(
        server_args_kv_cache_dtype=server_args.kv_cache_dtype,
        model=model,
        model_dtype=model_config.dtype,
        is_draft_worker=False,
        is_dflash=spec_algorithm.is_dflash_family(),
        speculative_draft_attention_backend=None,
        speculative_draft_kv_cache_dtype=None,
    )
    return kvc_module.KVCacheConfigurator(
        device="cuda",
        gpu_id=0,
        attn_dp_size=get_parallel().attn_dp_size,
        pp_size=1,
        # FAKE: the PP group; only its width is read, and one stage is judged.
        pp_group=types.SimpleNamespace(world_size=1),
        model=model,
        model_config=model_config,
        server_args=server_args,
        kv_cache_dtype=kv_cache_dtype,
        kv_cache_dtype_str=resolved_dtype or server_args.kv_cache_dtype,
        model_dtype=model_config.dtype,
        page_size=get_schedule().page_size,
        sliding_window_size=resolve_sliding_window_size(model, model_config),
        spec_algorithm=spec_algorithm,
        is_draft_worker=False,
        # is_post_capture_kv_active: off unless SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=1.
        post_capture_kv_active=False,
        spec_aux_config=resolve_spec_aux_hidden_state_config(
            server_args=server_args,
            model_config=model_config,
            spec_algorithm=spec_algorithm,
            is_draft_worker=False,
        ),
        is_hybrid_swa=model_config.is_hybrid_swa,
        is_hybrid_swa_compress=model_config.is_hybrid_swa_compress,
        use_mla_backend=model_config.attention_arch == AttentionArch.MLA,
        layer_info=resolve_layer_indices(
            model=model, model_config=model_config, is_draft_worker=False
        ),
        forward_stream=None,  # FAKE: no CUDA stream; pools are never built.
        req_to_token_pool=None,
        token_to_kv_pool_allocator=None,
        memory_pool_config=None,
    )


def cell_size_bytes(pool_configurator: Any) -> int | None:
    """Bytes per token of the (full-attention) pool, as the configurator charges it."""
    if hasattr(pool_configurator, "_full_cell_bytes"):  # HybridSWAPoolConfigurator
        return int(pool_configurator._full_cell_bytes())
    if hasattr(pool_configurator, "_cell_size"):  # DefaultPoolConfigurator
        return int(pool_configurator._cell_size)
    return None


def mamba_facts(configurator: Any) -> dict[str, Any] | None:
    """The mamba state pool ``_handle_max_mamba_cache`` sized (per DP rank)."""
    config = configurator.mambaish_config
    if config is None:
        return None
    return {
        "max_mamba_cache_size": get_schedule().max_mamba_cache_size,
        "mamba_cache_per_req_bytes": int(config.mamba2_cache_params.mamba_cache_per_req),
        "mamba_ratio": configurator._calculate_mamba_ratio(),
        "full_attention_layers": len(config.full_attention_layer_ids),
    }


def size_kv_pool(server_args: Any, model_config: ModelConfig, pre_gib: float) -> dict[str, Any]:
    """Run SGLang's own sizing; every exception propagates as the case's refusal."""
    configurator = build_configurator(server_args, model_config)
    config = configurator._resolve_memory_pool_config(pre_gib)
    pool_configurator = create_memory_pool_configurator(configurator)
    swa_cell = getattr(pool_configurator, "_swa_cell_bytes", None)
    return {
        "configurator": configurator,
        "kv_cache_dtype_torch": str(configurator.kv_cache_dtype),
        "kv_cache_dtype_str": configurator.kv_cache_dtype_str,
        "cell_size_bytes": cell_size_bytes(pool_configurator),
        "swa_cell_size_bytes": int(swa_cell()) if callable(swa_cell) else None,
        "max_total_num_tokens": int(config.max_total_num_tokens),
        "full_max_total_num_tokens": config.full_max_total_num_tokens,
        "swa_max_total_num_tokens": config.swa_max_total_num_tokens,
        "max_running_requests_per_dp": int(config.max_running_requests),
        "mamba": mamba_facts(configurator),
    }


class _SizingOnlyHostPool(HostKVCache):  # type: ignore[misc]
    """FAKE: a host pool that never allocates. ``HostKVCache.__init__`` and
    ``_allocate_host_buffer`` (mem_cache/pool_host/base.py) run unchanged: the token count from
    ``--hicache-ratio``/``--hicache-size`` with the padding page, and the per-rank budget check
    that raises "Not enough host memory available". Only ``init_kv_buffer`` (the allocation)
    is replaced; the abstract transfer methods are never called."""

    layer_num = 0
    target_layer_num = 0

    def init_kv_buffer(self) -> None:
        return None

    def get_size_per_token(self) -> int:
        return int(self.size_per_token)

    def load_to_device_per_layer(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    def backup_from_device_all_layer(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    def get_data_page(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    def get_dummy_flat_data_page(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    def set_from_flat_data_page(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError


_SizingOnlyHostPool.__abstractmethods__ = frozenset()


def _device_pool_stand_in(use_mla: bool, device_bytes: int) -> Any:
    """FAKE: the device KV pool ``hicache_auto_size._estimate_hicache_bytes`` measures; an
    uninitialised instance of the real class carrying only ``host_capacity_bytes``."""
    pool_class = MLATokenToKVPool if use_mla else MHATokenToKVPool
    pool = pool_class.__new__(pool_class)
    pool.host_capacity_bytes = device_bytes
    return pool


def auto_sized_ratio(pool: dict[str, Any]) -> float:
    """``--hicache-ratio`` after ``hicache_auto_size.auto_size_hicache`` (default sizing)."""
    configurator = pool["configurator"]
    device_bytes = pool["cell_size_bytes"] * pool["max_total_num_tokens"]
    params = types.SimpleNamespace(
        token_to_kv_pool_allocator=types.SimpleNamespace(
            get_kvcache=lambda: _device_pool_stand_in(configurator.use_mla_backend, device_bytes)
        ),
        req_to_token_pool=None,
        mtp_draft_device_pools=(),
    )
    with hicache_auto_size.auto_size_hicache(params, None, enabled=True):
        return float(get_memory().hicache_ratio)


def size_host_pool(pool: dict[str, Any]) -> dict[str, Any]:
    """HiCache host pool of one rank: tokens, bytes and the per-rank budget it was checked
    against. The bytes per token are the device pool's (pool_host/mha.py and mla.py
    ``get_size_per_token`` multiply the same heads, dims, layers and dtype)."""
    memory = get_memory()
    ratio = memory.hicache_ratio
    if memory.hicache_host_memory_fraction is not None:
        ratio = auto_sized_ratio(pool)
    budget = int(host_memory_budget_bytes())
    host = _SizingOnlyHostPool(
        dtype=torch.uint8,
        device_capacity_tokens=pool["max_total_num_tokens"],
        size_per_token=pool["cell_size_bytes"],
        start_layer=0,
        end_layer=0,
        host_to_device_ratio=ratio,
        host_size=memory.hicache_size,
        page_size=get_schedule().page_size,
        layout=memory.hicache_mem_layout,
        pin_memory=False,
        device="cpu",
    )
    return {
        "tokens": int(host.size),
        "bytes": int(host.size) * int(host.size_per_token),
        "budget_per_rank_bytes": budget,
        "hicache_ratio": float(ratio) if ratio is not None else None,
    }
