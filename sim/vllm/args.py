"""`vllm serve MODEL [flags]`: the flags the twin models, spelled as vLLM's CLI spells them,
resolved to the values vLLM 0.32 would use.

Argument errors exit 2 like argparse; configurations vLLM's config classes refuse raise
`ConfigError` with vLLM's message (the launcher prints it and exits 1).
"""

from __future__ import annotations

import argparse
import math
import os
import re
from dataclasses import dataclass, field

from sim.vllm.presets import DEFAULT_VLLM_PRESET, VllmPreset, get_vllm_preset

# vllm/config/cache.py:39-59 (the subset the twin models) and the bytes of one element.
KV_CACHE_DTYPES: dict[str, float | None] = {
    "auto": None,
    "bfloat16": 2,
    "float16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}
GIB = 1 << 30


class ConfigError(Exception):
    """A configuration vLLM refuses at start-up (ValueError / pydantic ValidationError)."""

    def __init__(self, message: str, exc_type: str = "ValueError") -> None:
        super().__init__(message)
        self.message = message
        self.exc_type = exc_type


def parse_bytes(text: str) -> int:
    """vllm/utils/argparse_utils.py:29: `1K`/`1M`/`1G` binary, `1k`/`1m`/`1g` decimal."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgGtT]?)\s*", text)
    if m is None:
        raise argparse.ArgumentTypeError(f"invalid size: {text!r}")
    number, suffix = float(m.group(1)), m.group(2)
    if not suffix:
        return int(number)
    power = "kmgt".index(suffix.lower()) + 1
    base = 1024 if suffix.isupper() else 1000
    return int(number * base**power)


def parse_len(text: str) -> int:
    """--max-model-len: integers, `1k` (decimal) / `1K` (binary), `auto` or -1."""
    if text.strip().lower() == "auto":
        return -1
    return parse_bytes(text) if text.strip() != "-1" else -1


@dataclass
class VllmConfig:
    model: str
    served_model_name: str
    preset: VllmPreset
    host: str
    port: int
    api_key: str | None
    gpu_memory_utilization: float
    kv_cache_dtype: str
    kv_dtype_bytes: float
    block_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_prefix_caching: bool
    enforce_eager: bool
    kv_cache_memory_bytes: int | None
    num_gpu_blocks_override: int | None
    tensor_parallel_size: int
    data_parallel_size: int
    kv_offloading_size: float | None  # GiB of pinned host memory, each DP engine the whole
    kv_offloading_backend: str
    host_ram_gib: float  # the twin's host (its preset's unless --host-ram-gb)
    time_scale: float
    seed: int
    dev_mode: bool
    log_stats_interval: float
    disable_log_stats: bool
    workload: str | None = None
    concurrency: int = 0
    non_default: dict[str, object] = field(default_factory=dict)


def build_parser(prog: str = "vllm serve") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, allow_abbrev=True)
    # vLLM's order (the "non-default args" line lists flags in it: model_tag, the frontend's
    # host and port, then the engine's model, max_model_len, enforce_eager, served_model_name,
    # ..., kv_cache_memory_bytes, num_gpu_blocks_override; startup_log_capped.txt)
    p.add_argument("model_tag", nargs="?", default=None)
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", nargs="+", default=None)
    p.add_argument("--model", default=None)
    p.add_argument("--max-model-len", type=parse_len, default=None)
    p.add_argument("--enforce-eager", action="store_true", default=False)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=None)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument(
        "--gpu-memory-utilization", "--device-memory-utilization", type=float, default=0.92
    )
    p.add_argument("--kv-cache-memory-bytes", type=parse_bytes, default=None)
    p.add_argument("--kv-cache-dtype", choices=sorted(KV_CACHE_DTYPES), default="auto")
    p.add_argument("--num-gpu-blocks-override", type=int, default=None)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--max-num-batched-tokens", type=parse_bytes, default=None)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--disable-log-stats", action="store_true", default=False)
    # config/cache.py `kv_offloading_size: float | None` (GiB), `kv_offloading_backend`
    p.add_argument("--kv-offloading-size", type=float, default=None)
    p.add_argument("--kv-offloading-backend", choices=("native", "lmcache"), default="native")
    # The twin's own flags.
    p.add_argument("--preset", default=DEFAULT_VLLM_PRESET)
    p.add_argument("--host-ram-gb", type=float, default=None)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workload", default=None)
    p.add_argument("--concurrency", type=int, default=0)
    return p


def batch_defaults(gpu_memory_mib: int, gpu_name: str) -> tuple[int, int]:
    """EngineArgs.get_batch_defaults (vllm/engine/arg_utils.py:2893-2985), for `vllm serve`:
    >= 160 GiB -> 1024 / 16384; >= 70 GiB and not an A100 -> 1024 / 8192; else 256 / 2048."""
    gib = gpu_memory_mib / 1024
    if gib >= 160:
        return 1024, 16384
    if gib >= 70 and "A100" not in gpu_name:
        return 1024, 8192
    return 256, 2048


def resolve(argv: list[str], prog: str = "vllm serve") -> VllmConfig:
    args = list(argv)
    if "serve" in args:  # the `vllm serve` subcommand, wherever the launcher put it
        args.remove("serve")
    parser = build_parser(prog)
    ns = parser.parse_args(args)
    try:
        preset = get_vllm_preset(ns.preset)
    except ValueError as exc:
        parser.error(str(exc))
    model = ns.model_tag or ns.model or preset.model.name
    ns.model = model  # vLLM: a positional model_tag becomes --model; both are listed
    twin_flags = ("preset", "time_scale", "seed", "workload", "concurrency", "host_ram_gb")
    non_default = {
        k: v for k, v in vars(ns).items() if v != parser.get_default(k) and k not in twin_flags
    }
    if ns.api_key:
        non_default["api_key"] = "[REDACTED]"
    spec = preset.model
    _check_utilization(ns.gpu_memory_utilization)
    if ns.data_parallel_size < 1:  # config/parallel.py `Field(default=1, ge=1)`
        raise ConfigError(
            "1 validation error for ParallelConfig\ndata_parallel_size\n  Input should be "
            f"greater than or equal to 1 [input_value={ns.data_parallel_size}, input_type=int]",
            "pydantic_core._pydantic_core.ValidationError",
        )
    max_model_len = _max_model_len(ns.max_model_len, spec.context_length)
    max_num_seqs, mnbt = _batch_limits(ns, preset, max_model_len)
    dtype_bytes = KV_CACHE_DTYPES[ns.kv_cache_dtype]
    if dtype_bytes is None:
        dtype_bytes = 1 if (spec.kv_cache_quant_algo or "").upper() == "FP8" else 2
    served = ns.served_model_name[0] if ns.served_model_name else model
    interval = float(os.environ.get("VLLM_LOG_STATS_INTERVAL", "10") or 10)
    return VllmConfig(
        model=model,
        served_model_name=served,
        preset=preset,
        host=ns.host or "0.0.0.0",
        port=ns.port,
        api_key=(ns.api_key[0] if ns.api_key else os.environ.get("VLLM_API_KEY")),
        gpu_memory_utilization=ns.gpu_memory_utilization,
        kv_cache_dtype=ns.kv_cache_dtype,
        kv_dtype_bytes=dtype_bytes,
        block_size=ns.block_size or preset.block_size,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=mnbt,
        enable_prefix_caching=ns.enable_prefix_caching is not False,
        enforce_eager=ns.enforce_eager,
        kv_cache_memory_bytes=ns.kv_cache_memory_bytes,
        num_gpu_blocks_override=ns.num_gpu_blocks_override,
        tensor_parallel_size=ns.tensor_parallel_size or preset.base.tp_size,
        data_parallel_size=ns.data_parallel_size,
        kv_offloading_size=ns.kv_offloading_size,
        kv_offloading_backend=ns.kv_offloading_backend,
        host_ram_gib=ns.host_ram_gb if ns.host_ram_gb is not None else preset.base.host_ram_gib,
        time_scale=ns.time_scale,
        seed=ns.seed,
        dev_mode=os.environ.get("VLLM_SERVER_DEV_MODE") == "1",
        # envs.py:866: <= 0 means the default 10 s
        log_stats_interval=interval if interval > 0 else 10.0,
        disable_log_stats=ns.disable_log_stats,
        workload=ns.workload,
        concurrency=ns.concurrency,
        non_default=non_default,
    )


def _check_utilization(util: float) -> None:
    """pydantic Field(gt=0, le=1) on CacheConfig.gpu_memory_utilization (config/cache.py:102)."""
    if 0 < util <= 1:
        return
    bound = "greater than 0" if util <= 0 else "less than or equal to 1"
    raise ConfigError(
        "1 validation error for CacheConfig\ngpu_memory_utilization\n"
        f"  Input should be {bound} [input_value={util}, input_type=float]",
        "pydantic_core._pydantic_core.ValidationError",
    )


def _max_model_len(requested: int | None, derived: int) -> int:
    max_model_len = requested if requested is not None else derived
    if max_model_len > derived and os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") != "1":
        # vllm/config/model.py:2645-2665
        raise ConfigError(
            f"User-specified max_model_len ({max_model_len}) is greater than the derived "
            f"max_model_len (max_position_embeddings={derived} or model_max_length=None in "
            "model's config.json). To allow overriding this maximum, set the env var "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with "
            "extreme caution. If the model uses relative position encoding (RoPE), positions "
            "exceeding derived_max_model_len lead to nan. If the model uses absolute position "
            "encoding, positions exceeding derived_max_model_len will cause a CUDA array "
            "out-of-bounds error."
        )
    if max_model_len == -1:
        raise ConfigError("the twin does not model --max-model-len auto")
    return max_model_len


def _batch_limits(
    ns: argparse.Namespace, preset: VllmPreset, max_model_len: int
) -> tuple[int, int]:
    mem = preset.base.memory
    default_seqs, default_tokens = batch_defaults(mem.gpu_memory_mib, preset.base.gpu_name)
    max_num_seqs = int(ns.max_num_seqs) if ns.max_num_seqs is not None else default_seqs
    mnbt = ns.max_num_batched_tokens
    if mnbt is None:
        # arg_utils.py:3097-3190: defaults capped at max_num_seqs * max_model_len
        mnbt = min(default_tokens, max_num_seqs * max_model_len)
    if ns.max_num_seqs is None:
        max_num_seqs = min(max_num_seqs, mnbt)
    if mnbt < max_num_seqs:
        # vllm/config/scheduler.py:328-333
        raise ConfigError(
            f"max_num_batched_tokens ({mnbt}) must be greater than or equal to max_num_seqs "
            f"({max_num_seqs})."
        )
    return max_num_seqs, int(mnbt)


def ceil_gib_bytes(total_mib: int, fraction: float) -> int:
    """requested_memory = ceil(total x utilization) in bytes (vllm/v1/worker/utils.py:716)."""
    return math.ceil(total_mib * (1 << 20) * fraction)
