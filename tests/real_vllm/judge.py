"""Judge side: the KV pool real vLLM 0.32.0 sizes for a model shape, by vLLM's own code.

Runs under the vLLM venv (``tests/real_vllm/setup.sh``)::

    .venv-vllm/bin/python tests/real_vllm/judge.py < cases.json > results.json

Input: ``{"cases": [case, ...]}``; a case is

    name                 label, echoed back
    layers               one dict per attention layer of the whole model:
                         {"type": "full" | "sliding" | "mla", "kv_heads": total KV heads,
                          "head_size": int, "window": int (sliding only)}
    block_size, kv_dtype (vLLM's --kv-cache-dtype name, "auto" = the model's bf16), tp,
    max_model_len, max_num_batched_tokens
    total_bytes, utilization, non_kv_bytes   one GPU, for the profiled path
    kv_cache_memory_bytes                    or None: --kv-cache-memory-bytes, per GPU

Output: ``{"results": [...], "timing": {...}}``, per case ``num_blocks`` (one engine, null block
in), ``kv_cache_size_tokens`` (the "GPU KV cache size: N tokens" figure), ``max_concurrency``,
``bytes_per_block``, ``page_size_bytes`` per group, ``available_bytes``, or ``error`` with the
text vLLM raised (a pool too small for one max_model_len request).

Only the KV sizing runs: the per-layer specs are vLLM's own classes, built with the arguments
its attention layers pass (model_executor/layers/attention/attention.py:606-677,
mla_attention.py:1350-1381), and ``get_kv_cache_configs`` / ``get_kv_cache_capacity`` do the
rest as the engine core does (v1/engine/core.py:325-357). The profile run is replaced by a given
non-KV figure: what ``Worker.determine_available_memory`` subtracts (module docstring of
playbooks/engines/vllm/capacity.py). Everything here runs on the CPU.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # stdout carries the JSON only

START = time.perf_counter()
import torch  # noqa: E402
from vllm.config.model import ModelConfig  # noqa: E402
from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype  # noqa: E402
from vllm.v1.core import kv_cache_utils as kcu  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    get_kv_quant_mode,
)
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402

IMPORTED = time.perf_counter()
# FlashAttention's preferred layout ("NHD", config/cache.py:20-23): layer-outermost, so a
# block's bytes are the sum of its layers' pages (kv_cache_utils.py:1520-1531).
LAYOUT = KVCacheLayout.LBNHC
# Async scheduling (on by default) keeps two batches in flight (config/vllm.py:577-598); only
# the sliding-window admission bound and the reported token figure read it.
CONCURRENT_BATCHES = 2


def fake_config(case: dict[str, Any]) -> Any:
    """The attributes of VllmConfig that KV sizing reads, and nothing else."""
    max_len = int(case["max_model_len"])
    cache = SimpleNamespace(
        block_size=int(case["block_size"]),
        cache_dtype=case["kv_dtype"],
        num_gpu_blocks_override=case.get("num_gpu_blocks_override"),
        prefix_cache_retention_interval=None,
        kv_cache_layout=LAYOUT.name,
        get_resolved_kv_cache_layout=lambda: LAYOUT,
        mamba_cache_mode="none",
        skip_page_size_padded=None,
        num_gpu_blocks=None,
        kv_cache_size_tokens=None,
        kv_cache_max_concurrency=None,
    )
    tokens = int(case.get("max_num_batched_tokens") or 8192)
    return SimpleNamespace(
        cache_config=cache,
        model_config=SimpleNamespace(
            max_model_len=max_len, original_max_model_len=max_len, dtype=torch.bfloat16
        ),
        parallel_config=SimpleNamespace(
            tensor_parallel_size=int(case["tp"]),
            decode_context_parallel_size=1,
            pipeline_parallel_size=1,
        ),
        scheduler_config=SimpleNamespace(
            disable_hybrid_kv_cache_manager=False, max_num_batched_tokens=tokens
        ),
        attention_config=SimpleNamespace(hisparse_config=None),
        device_config=SimpleNamespace(device_type="cuda"),
        speculative_config=None,
        num_prefill_lookahead_tokens=0,
        max_in_flight_tokens=CONCURRENT_BATCHES * tokens,
    )


def kv_heads_per_rank(layer: dict[str, Any], tp: int) -> int:
    """vLLM's own split of KV heads over TP ranks (config/model.py:1650-1670)."""
    fake = SimpleNamespace(
        use_mla=layer["type"] == "mla",
        model_arch_config=SimpleNamespace(total_num_kv_heads=int(layer.get("kv_heads", 1))),
    )
    return int(ModelConfig.get_num_kv_heads(fake, SimpleNamespace(tensor_parallel_size=tp)))


def layer_spec(layer: dict[str, Any], case: dict[str, Any], config: Any) -> KVCacheSpec:
    dtype_name = case["kv_dtype"]
    dtype = kv_cache_dtype_str_to_dtype(dtype_name, config.model_config)
    heads = kv_heads_per_rank(layer, int(case["tp"]))
    common: dict[str, Any] = {
        "block_size": int(case["block_size"]),
        "num_kv_heads": heads,
        "head_size": int(layer["head_size"]),
        "dtype": dtype,
        "kv_quant_mode": get_kv_quant_mode(dtype_name),
    }
    if layer["type"] == "mla":
        return MLAAttentionSpec(**common, max_tp_shards=1, cache_dtype_str=dtype_name)
    if layer["type"] == "sliding":
        # The SW layer takes the primary block size where the backend runs it unsplit
        # (attention.py:637-659, FlashAttention supports any multiple of 16).
        return SlidingWindowSpec(**common, sliding_window=int(layer["window"]))
    return FullAttentionSpec(**common)


def available_bytes(case: dict[str, Any]) -> int:
    """Worker.determine_available_memory (v1/worker/gpu_worker.py:649-671, 740-744): the KV
    bytes flag as given, else ceil(total * utilization) (v1/worker/utils.py:724-726) less
    everything the profile saw besides the KV cache."""
    flag = case.get("kv_cache_memory_bytes")
    if flag:
        return int(flag)
    requested = math.ceil(int(case["total_bytes"]) * float(case["utilization"]))
    return requested - int(case["non_kv_bytes"])


def size(case: dict[str, Any]) -> dict[str, Any]:
    config = fake_config(case)
    per_rank = {
        f"model.layers.{i}.attn": layer_spec(layer, case, config)
        for i, layer in enumerate(case["layers"])
    }
    tp = int(case["tp"])
    memory = available_bytes(case)
    out: dict[str, Any] = {"name": case["name"], "available_bytes": memory}
    try:
        configs = kcu.get_kv_cache_configs(
            config, [dict(per_rank) for _ in range(tp)], [memory] * tp
        )
    except ValueError as exc:
        return {**out, "error": str(exc)}
    scheduler = kcu.generate_scheduler_kv_cache_config(configs)
    # as the engine core does before it logs the capacity (v1/engine/core.py:339-357)
    config.cache_config.block_size = min(
        g.kv_cache_spec.block_size for g in scheduler.kv_cache_groups
    )
    tokens, concurrency = kcu.get_kv_cache_capacity(config, scheduler)
    groups = configs[0].kv_cache_groups
    return {
        **out,
        "num_blocks": scheduler.num_blocks,
        "kv_cache_size_tokens": tokens,
        "max_concurrency": concurrency,
        "bytes_per_block": kcu._pool_bytes_per_block(config, groups),
        "groups": [len(g.layer_names) for g in groups],
        "page_size_bytes": [g.kv_cache_spec.page_size_bytes for g in scheduler.kv_cache_groups],
    }


def main() -> None:
    cases = json.load(sys.stdin)["cases"]
    began = time.perf_counter()
    results = [size(case) for case in cases]
    done = time.perf_counter()
    timing = {
        "import_s": round(IMPORTED - START, 2),
        "cases": len(cases),
        "ms_per_case": round(1000 * (done - began) / max(1, len(cases)), 2),
    }
    json.dump({"results": results, "timing": timing}, sys.stdout)


if __name__ == "__main__":
    main()
