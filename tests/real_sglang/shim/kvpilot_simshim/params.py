"""Simulation parameters, read from the environment (documented in ../README.md).

This module is plain Python (no torch, no sglang) so the formulas can be checked in isolation.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

GIB = 1 << 30


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    return float(raw) if raw else default


@dataclass(frozen=True)
class SimParams:
    gpu_gib: float = 141.0  # KVPILOT_SIM_GPU_GIB: total memory of one simulated GPU, GiB
    weights_gib: float = 15.0  # KVPILOT_SIM_WEIGHTS_GIB: weights resident on one GPU, GiB
    overhead_gib: float = 1.4  # KVPILOT_SIM_OVERHEAD_GIB: other static non-KV memory, GiB
    prefill_base_ms: float = 10.0
    prefill_ms_per_token: float = 0.05
    decode_base_ms: float = 12.0
    decode_ms_per_seq: float = 0.05
    decode_ms_per_ktoken: float = 0.02
    time_scale: float = 1.0

    @classmethod
    def from_env(cls) -> SimParams:
        d = cls()
        scale = _float("KVPILOT_SIM_TIME_SCALE", d.time_scale)
        if scale <= 0:
            raise ValueError("KVPILOT_SIM_TIME_SCALE must be > 0")
        return cls(
            gpu_gib=_float("KVPILOT_SIM_GPU_GIB", d.gpu_gib),
            weights_gib=_float("KVPILOT_SIM_WEIGHTS_GIB", d.weights_gib),
            overhead_gib=_float("KVPILOT_SIM_OVERHEAD_GIB", d.overhead_gib),
            prefill_base_ms=_float("KVPILOT_SIM_PREFILL_BASE_MS", d.prefill_base_ms),
            prefill_ms_per_token=_float("KVPILOT_SIM_PREFILL_MS_PER_TOKEN", d.prefill_ms_per_token),
            decode_base_ms=_float("KVPILOT_SIM_DECODE_BASE_MS", d.decode_base_ms),
            decode_ms_per_seq=_float("KVPILOT_SIM_DECODE_MS_PER_SEQ", d.decode_ms_per_seq),
            decode_ms_per_ktoken=_float("KVPILOT_SIM_DECODE_MS_PER_KTOKEN", d.decode_ms_per_ktoken),
            time_scale=scale,
        )

    # --- memory -------------------------------------------------------------------------------

    def gpu_capacity_mib(self) -> float:
        """What SGLang's ``get_device_memory_capacity`` returns (MiB, like nvidia-smi)."""
        return self.gpu_gib * 1024

    def rest_bytes(self, mem_fraction_static: float) -> int:
        """KV-cache byte budget handed to SGLang's pool configurator.

        rest_bytes = int((mem_fraction_static * GPU_GIB - WEIGHTS_GIB - OVERHEAD_GIB) * 2**30)
        """
        return int(
            (mem_fraction_static * self.gpu_gib - self.weights_gib - self.overhead_gib) * GIB
        )

    # --- time ---------------------------------------------------------------------------------

    def prefill_seconds(self, new_tokens: int) -> float:
        ms = self.prefill_base_ms + self.prefill_ms_per_token * new_tokens
        return ms / 1000.0 / self.time_scale

    def decode_seconds(self, batch_size: int, kv_tokens: int) -> float:
        ms = (
            self.decode_base_ms
            + self.decode_ms_per_seq * batch_size
            + self.decode_ms_per_ktoken * kv_tokens / 1000.0
        )
        return ms / 1000.0 / self.time_scale


def predict_max_total_num_tokens(
    params: SimParams,
    *,
    mem_fraction_static: float,
    cell_size: int,
    page_size: int = 1,
    max_total_tokens: int | None = None,
) -> int:
    """What ``/server_info`` → ``max_total_num_tokens`` will show for a plain MHA model."""
    tokens = params.rest_bytes(mem_fraction_static) // cell_size
    tokens = tokens // page_size * page_size
    if max_total_tokens is not None and max_total_tokens < tokens:
        tokens = max_total_tokens // page_size * page_size
    return tokens
