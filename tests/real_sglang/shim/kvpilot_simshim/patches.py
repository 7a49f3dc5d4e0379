"""Patches applied to sglang 0.5.23 modules right after they are imported.

Each ``_patch_<area>`` receives the freshly executed module. The names patched here are internal to
SGLang 0.5.23; other versions will need changes (the functions fail loudly when a name is missing).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import logging
import os
import threading
import time
import types
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

from .params import GIB, SimParams

logger = logging.getLogger("kvpilot_simshim")

PARAMS = SimParams.from_env()
_FALLBACK_TOKEN_ID = 11


def _require(obj: Any, *names: str) -> None:
    missing = [n for n in names if not hasattr(obj, n)]
    if missing:
        raise RuntimeError(
            f"kvpilot shim: {getattr(obj, '__name__', obj)!r} lacks {missing}; "
            "the shim targets sglang 0.5.23"
        )


# --------------------------------------------------------------------------------------------
# Simulated GPU memory capacity (drives the auto mem_fraction_static / chunked_prefill_size /
# cuda-graph batch-size defaults exactly as on a GPU with KVPILOT_SIM_GPU_GIB of memory).
# --------------------------------------------------------------------------------------------


def _patch_utils_common(mod: types.ModuleType) -> None:
    _require(mod, "get_device_memory_capacity")

    def get_device_memory_capacity(device: str | None = None) -> float:
        return PARAMS.gpu_capacity_mib()

    mod.get_device_memory_capacity = get_device_memory_capacity  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------------
# KV cache sizing and pools
# --------------------------------------------------------------------------------------------

_COMPACT = threading.local()


def _patch_kv_cache_configurator(mod: types.ModuleType) -> None:
    cls = mod.KVCacheConfigurator  # type: ignore[attr-defined]
    _require(cls, "_profile_available_bytes", "configure", "_build_token_to_kv_pool")
    _require(mod, "get_schedule", "cpu_has_amx_support", "attention_backends")

    def _profile_available_bytes(self: Any, pre_model_load_memory: Any) -> int:
        mfs = float(mod.get_schedule().mem_fraction_static)  # type: ignore[attr-defined]
        rest = PARAMS.rest_bytes(mfs)
        logger.info(
            "kvpilot sim: KV budget = (%.4f x %.3f GiB - %.3f GiB weights - %.3f GiB overhead)"
            " = %d bytes",
            mfs,
            PARAMS.gpu_gib,
            PARAMS.weights_gib,
            PARAMS.overhead_gib,
            rest,
        )
        if self.mambaish_config is not None:
            rest = int(self._handle_max_mamba_cache(rest / GIB) * GIB)
        if rest <= 0:
            minimum = (PARAMS.weights_gib + PARAMS.overhead_gib) / PARAMS.gpu_gib
            raise ValueError(
                "Loaded weights leave no GPU memory for the KV cache under "
                f"--mem-fraction-static={mfs}. Raise --mem-fraction-static above "
                f"{minimum:.3f}."
            )
        return rest

    cls._profile_available_bytes = _profile_available_bytes

    # The CPU engine only allows an fp8 KV cache with Intel AMX and the intel_amx attention
    # backend. The simulated GPU has neither constraint: report AMX present and the backend as
    # intel_amx while configure() runs (nothing ever executes attention here).
    orig_cpu_has_amx = mod.cpu_has_amx_support  # type: ignore[attr-defined]
    orig_attention_backends = mod.attention_backends  # type: ignore[attr-defined]
    state = threading.local()

    def cpu_has_amx_support() -> bool:
        return True if getattr(state, "active", False) else bool(orig_cpu_has_amx())

    def attention_backends() -> Any:
        backends = orig_attention_backends()
        if getattr(state, "active", False):
            return tuple("intel_amx" if b is not None else None for b in backends)
        return backends

    mod.cpu_has_amx_support = cpu_has_amx_support  # type: ignore[attr-defined]
    mod.attention_backends = attention_backends  # type: ignore[attr-defined]

    orig_configure = cls.configure

    @functools.wraps(orig_configure)
    def configure(self: Any, *args: Any, **kwargs: Any) -> Any:
        state.active = True
        try:
            return orig_configure(self, *args, **kwargs)
        finally:
            state.active = False

    cls.configure = configure

    # Compact device pools: the real pool would hold head_num x head_dim elements per token and
    # layer (128 KiB/token for the Llama-8B shape). The token count is already decided when the
    # pools are built, so they are allocated with one head of dimension one instead.
    orig_build = cls._build_token_to_kv_pool

    @functools.wraps(orig_build)
    def _build_token_to_kv_pool(self: Any, *args: Any, **kwargs: Any) -> Any:
        config = self.model_config
        heads = config.get_num_kv_heads(
            mod.get_parallel().attn_tp_size,  # type: ignore[attr-defined]
            mod.get_parallel().attn_dcp_size,  # type: ignore[attr-defined]
        )
        real = (heads * config.head_dim, heads * config.v_head_dim)
        with _compact_model_config(config) as compacted:
            _REAL_GEOMETRY.value = real if compacted else None
            try:
                pool = orig_build(self, *args, **kwargs)
            finally:
                _REAL_GEOMETRY.value = None
        mem_usage = getattr(pool, "mem_usage", None)
        if isinstance(mem_usage, float):
            free = PARAMS.gpu_gib - PARAMS.weights_gib - PARAMS.overhead_gib - mem_usage
            SIMULATED_FREE_AFTER_KV_GIB[:] = [free]
            logger.info("kvpilot sim: simulated free GPU memory after the KV pool: %.3f GiB", free)
        return pool

    cls._build_token_to_kv_pool = _build_token_to_kv_pool


# Free memory of the simulated GPU once the KV pool exists, in GiB (set when the pool is built).
SIMULATED_FREE_AFTER_KV_GIB: list[float] = []


# (K, V) elements per token and layer of the real geometry, while a compact pool is being built.
_REAL_GEOMETRY = threading.local()


def _patch_memory_pool(mod: types.ModuleType) -> None:
    """Report the bytes a pool would take at full geometry (the "KV Cache is allocated" log line
    and ``mem_usage``, which feeds /server_info, /v1/loads and kv_cache_memory_usage_gb)."""
    cls = mod.KVCache  # type: ignore[attr-defined]
    _require(cls, "_finalize_allocation_log")
    orig = cls._finalize_allocation_log

    @functools.wraps(orig)
    def _finalize_allocation_log(self: Any, num_tokens: int) -> None:
        real = getattr(_REAL_GEOMETRY, "value", None)
        sizes = self.get_kv_size_bytes() if real is not None else None
        if not (isinstance(sizes, tuple) and len(sizes) == 2):
            orig(self, num_tokens)  # pools without separate K/V buffers keep their compact size
            return
        # The compact buffers hold one element per token and layer.
        scaled = (int(sizes[0]) * real[0], int(sizes[1]) * real[1])
        self.get_kv_size_bytes = lambda: scaled
        try:
            orig(self, num_tokens)
        finally:
            del self.get_kv_size_bytes
        logger.info(
            "kvpilot sim: the KV pool above is held compactly in host memory (%.3f GiB)",
            (int(sizes[0]) + int(sizes[1])) / GIB,
        )

    cls._finalize_allocation_log = _finalize_allocation_log


@contextlib.contextmanager
def _compact_model_config(model_config: Any) -> Iterator[bool]:
    if os.environ.get("KVPILOT_SIM_COMPACT_POOLS", "1") == "0":
        yield False
        return
    saved = {
        k: model_config.__dict__[k]
        for k in ("head_dim", "v_head_dim")
        if k in model_config.__dict__
    }
    model_config.head_dim = 1
    model_config.v_head_dim = 1
    model_config.get_num_kv_heads = lambda *args, **kwargs: 1
    try:
        yield True
    finally:
        del model_config.get_num_kv_heads
        for key, value in saved.items():
            setattr(model_config, key, value)


# --------------------------------------------------------------------------------------------
# ModelRunner: no weights, no attention backends, no graphs; forward returns empty logits and
# sampling returns one constant token.
# --------------------------------------------------------------------------------------------


def _sample_token_id(model_config: Any) -> int:
    raw = os.environ.get("KVPILOT_SIM_TOKEN_ID", "").strip()
    if raw:
        return int(raw)
    value = getattr(getattr(model_config, "hf_config", None), "kvpilot_sample_token_id", None)
    return int(value) if value is not None else _FALLBACK_TOKEN_ID


def _patch_model_runner(mod: types.ModuleType) -> None:
    torch = importlib.import_module("torch")  # only SGLang processes import torch

    cls = mod.ModelRunner  # type: ignore[attr-defined]
    _require(
        cls,
        "load_model",
        "forward",
        "sample",
        "compute_logprobs_only",
        "init_attention_backends",
        "init_cuda_graphs",
    )
    output_cls = mod.ModelRunnerOutput  # type: ignore[attr-defined]

    class SimulatedModel(torch.nn.Module):
        """Stands in for the model: no parameters, never called."""

        def __init__(self, num_layers: int) -> None:
            super().__init__()
            self.start_layer = 0
            self.end_layer = num_layers

        def forward(
            self, input_ids: Any, positions: Any, forward_batch: Any, pp_proxy_tensors: Any = None
        ) -> Any:
            raise RuntimeError("the simulated model is never called")

    def load_model(self: Any) -> None:
        tic = time.perf_counter()
        self.loader = SimpleNamespace(preloaded_weights_bytes=0)
        self.model = SimulatedModel(self.model_config.num_hidden_layers)
        self.startup_weight_load = None
        self.sliding_window_size = None
        self.prefill_aware_swa = False
        self.dtype = self.model_config.dtype
        self.weight_load_mem_usage = PARAMS.weights_gib  # reported as memory_usage.weight
        self.weight_load_time = time.perf_counter() - tic
        self.sim_sample_token_id = _sample_token_id(self.model_config)
        logger.info(
            "Load weight end. elapsed=0.00 s, type=SimulatedModel (kvpilot shim; weights %.2f GiB "
            "simulated), sampled token id %d.",
            PARAMS.weights_gib,
            self.sim_sample_token_id,
        )

    def forward(self: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
        logits_processor = importlib.import_module("sglang.srt.layers.logits_processor")
        self.forward_pass_id += 1
        bs = int(forward_batch.batch_size)
        logits = torch.zeros((bs, 1), dtype=torch.float32)
        return output_cls(
            logits_output=logits_processor.LogitsProcessorOutput(next_token_logits=logits),
            can_run_graph=False,
        )

    def sample(self: Any, logits_output: Any, forward_batch: Any) -> Any:
        bs = int(forward_batch.batch_size)
        token = getattr(self, "sim_sample_token_id", _FALLBACK_TOKEN_ID)
        return torch.full((bs,), token, dtype=torch.int64)

    def compute_logprobs_only(self: Any, logits_output: Any, forward_batch: Any) -> None:
        return None

    def init_attention_backends(self: Any) -> None:
        self.prefill_attention_backend_str = "simulated"
        self.decode_attention_backend_str = "simulated"
        self.attn_backend = None
        self.decode_attn_backend = None
        self.decode_attn_backend_group = []

    def init_cuda_graphs(self: Any, capture_decode_cuda_graph: bool = True) -> None:
        self.eager_runner = None
        self.prefill_cuda_graph_runner = None
        self.decode_cuda_graph_runner = None
        self.decode_cuda_graph_captured = False
        self.decode_cuda_graph_capture_bs = []
        self.graph_memory_usage = {}
        self.graph_time_usage = {}

    cls.load_model = load_model
    cls.forward = forward
    cls.sample = sample
    cls.compute_logprobs_only = compute_logprobs_only
    cls.init_attention_backends = init_attention_backends
    cls.init_cuda_graphs = init_cuda_graphs


# --------------------------------------------------------------------------------------------
# Scheduler: sleep for the modelled step time; no overlap loop.
# --------------------------------------------------------------------------------------------


class _StepLog:
    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1)  # noqa: SIM115

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")


def step_seconds(batch: Any) -> tuple[str, float, dict[str, int]]:
    """The modelled duration of one forward step of ``batch`` (see README.md)."""
    mode = batch.forward_mode
    if mode.is_idle():
        return "idle", 0.0, {}
    if mode.is_decode():
        bs = int(batch.batch_size())
        seq_lens = getattr(batch, "seq_lens_cpu", None)
        kv_tokens = int(seq_lens.sum()) if seq_lens is not None else int(batch.seq_lens_sum or 0)
        return "decode", PARAMS.decode_seconds(bs, kv_tokens), {"bs": bs, "kv_tokens": kv_tokens}
    new_tokens = int(batch.extend_num_tokens or 0)
    return (
        "prefill",
        PARAMS.prefill_seconds(new_tokens),
        {
            "bs": int(batch.batch_size()),
            "new_tokens": new_tokens,
        },
    )


def _patch_scheduler(mod: types.ModuleType) -> None:
    cls = mod.Scheduler  # type: ignore[attr-defined]
    _require(cls, "run_batch", "event_loop_normal", "event_loop_overlap")
    orig_run_batch = cls.run_batch
    path = os.environ.get("KVPILOT_SIM_STEP_LOG", "").strip()
    step_log = _StepLog(path) if path else None

    @functools.wraps(orig_run_batch)
    def run_batch(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        kind, seconds, info = step_seconds(batch)
        result = orig_run_batch(self, batch, *args, **kwargs)
        remaining = seconds - (time.perf_counter() - start)
        if remaining > 0:
            time.sleep(remaining)
        if step_log is not None:
            step_log.write({"t": time.time(), "kind": kind, "model_s": seconds, **info})
        return result

    cls.run_batch = run_batch
    cls.event_loop_overlap = cls.event_loop_normal

    # The scheduler records the free device memory after start-up (memory_usage.startup_available
    # and the startup_available_gpu_memory_gb gauge): report the simulated GPU's.
    orig_available = mod.get_available_gpu_memory  # type: ignore[attr-defined]

    def get_available_gpu_memory(*args: Any, **kwargs: Any) -> float:
        if SIMULATED_FREE_AFTER_KV_GIB:
            return SIMULATED_FREE_AFTER_KV_GIB[0]
        return float(orig_available(*args, **kwargs))

    mod.get_available_gpu_memory = get_available_gpu_memory  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------------
# HiCache host pools: no pinned (page-locked) memory on a CPU-only torch.
# --------------------------------------------------------------------------------------------


def _patch_pool_host_base(mod: types.ModuleType) -> None:
    cls = mod.HostKVCache  # type: ignore[attr-defined]
    orig_init = cls.__init__

    @functools.wraps(orig_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["pin_memory"] = False
        orig_init(self, *args, **kwargs)

    cls.__init__ = __init__


# L1 (device) <-> L2 (host) copies: the pools are compact placeholders, so the physical copy is
# skipped; the transfer bookkeeping (events, layer-done callbacks, radix-tree state) is real.


def _patch_l2_transfer(mod: types.ModuleType) -> None:
    torch = importlib.import_module("torch")

    cls = mod.L2TransferEngine  # type: ignore[attr-defined]
    _require(cls, "_submission", "submit_device_to_host", "submit_host_to_device")
    if not hasattr(torch.cpu.Stream, "synchronize"):
        torch.cpu.Stream.synchronize = lambda self: None

    def submit_device_to_host(self: Any, transfers: list[Any]) -> Any:
        with self._submission(transfers, self.device_to_host_stream, "device_to_host") as (
            _prepared,
            completion,
        ):
            pass
        return completion

    def submit_host_to_device(
        self: Any,
        transfers: list[Any],
        *,
        transfer_layer_id_max: int,
        start_event: Any = None,
        on_layer_done: Any = None,
    ) -> Any:
        with self._submission(
            transfers, self.host_to_device_stream, "host_to_device", start_event
        ) as (_prepared, completion):
            if on_layer_done is not None:
                for layer_id in range(transfer_layer_id_max):
                    on_layer_done(layer_id)
        return completion

    cls.submit_device_to_host = submit_device_to_host
    cls.submit_host_to_device = submit_host_to_device


PATCHES: dict[str, Callable[[types.ModuleType], None]] = {
    "sglang.srt.utils.common": _patch_utils_common,
    "sglang.srt.mem_cache.kv_cache_configurator": _patch_kv_cache_configurator,
    "sglang.srt.model_executor.model_runner": _patch_model_runner,
    "sglang.srt.managers.scheduler": _patch_scheduler,
    "sglang.srt.mem_cache.memory_pool": _patch_memory_pool,
    "sglang.srt.mem_cache.pool_host.base": _patch_pool_host_base,
    "sglang.srt.mem_cache.l2_transfer": _patch_l2_transfer,
}
