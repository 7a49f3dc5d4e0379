"""What a check of one launch argument is: a safety half and a usefulness half, kept apart.

Safety (will it start, will it run out of GPU or host memory, does it cost accuracy) needs only
the server's facts, so a change can be judged before anything is measured. Usefulness (does it
address the bottleneck) reads a measurement. Each half answers with a `Finding` (engine-neutral:
`playbooks.engines.findings`); `verdicts.py` combines them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from playbooks.engines.findings import NOTHING, BatchCap, Finding
from playbooks.engines.kit import checks as kit
from playbooks.engines.sglang.capacity import KV_DTYPE_BYTES, CapacityModel
from playbooks.engines.sglang.deployment import attn_dp_size, dp_replicas
from playbooks.engines.sglang.facts import Server, context_len, running_cap_per_rank

# The checks import a finding's type from here, beside the rest.
__all__ = [
    "DEFAULT_DTYPE_BYTES",
    "NOTHING",
    "SWA_OFF_WITH_HICACHE",
    "Change",
    "Check",
    "Finding",
    "attn_ranks_after",
    "cell_after",
    "cell_without_swa_pool",
    "dtype_bytes",
    "model_words",
    "swa_pool_off_with_hicache",
]

DEFAULT_DTYPE_BYTES = 2.0  # a dtype the table does not list is taken as 16-bit


def dtype_bytes(dtype: str) -> float:
    return KV_DTYPE_BYTES.get(dtype, DEFAULT_DTYPE_BYTES)


@dataclass(frozen=True)
class Change:
    """A proposed change and what follows from it before any measurement.

    Arguments interact (a new fraction moves the activation room a larger prefill chunk needs,
    enabling HiCache takes GPU memory), so every check sees the whole change, not one value.
    """

    server: Server
    values: Mapping[str, Any]
    fraction: float  # mem_fraction_static after the change
    dtype: str  # kv_cache_dtype after the change
    hicache: bool  # whether the hierarchical cache is on after the change
    tokens: int  # predicted KV capacity after the change, over all schedulers (ranks, replicas)
    bytes_per_token: float  # of the pool after the change
    ranks: int = 1  # attention-DP ranks after the change

    @property
    def cap(self) -> CapacityModel:
        return self.server.cap

    @property
    def ranks_now(self) -> int:
        return attn_dp_size(self.server.info)

    @property
    def replicas(self) -> int:
        """`--dp-size` replicas: each has the pool and the request cap a change gives one."""
        return dp_replicas(self.server.info)

    @property
    def per_scheduler(self) -> int:
        """One scheduler's pool after the change (an attention-DP rank's, or a replica's)."""
        return self.tokens // (self.ranks * self.replicas)

    @property
    def current(self) -> int:
        return self.server.info.max_total_num_tokens * self.ranks_now * self.replicas

    @property
    def running_cap_per_rank(self) -> int:
        """The per-rank request cap SGLang will resolve after the change."""
        info = self.server.info
        user = self.values.get("max_running_requests", info.arg("max_running_requests"))
        cap = running_cap_per_rank(
            self.per_scheduler, None if user is None else int(user), self.ranks, context_len(info)
        )
        now = info.effective_max_running_requests
        if self.cap.kv_share < 1 and now is not None:
            # The mamba state cache caps requests too; it grows with the budget it shares.
            rest = self.cap.kv_gib / self.cap.kv_share
            grown = rest + self.cap.budget_growth_gib(self.fraction)
            cap = min(cap, int(now * grown / rest))
        return cap

    @property
    def batch_caps(self) -> tuple[BatchCap, ...]:
        """The running-request cap after the change, over the whole server: SGLang divides the
        global flag over the attention-DP ranks and each rank's scheduler admits up to its
        share (`managers/scheduler.py` `get_num_allocatable_reqs`)."""
        per_rank, ranks = self.running_cap_per_rank, self.ranks
        user = self.values.get("max_running_requests", self.server.info.arg("max_running_requests"))
        name = "max_running_requests" + ("" if user is None else f"={user}")
        if self.replicas > 1:
            name += f" ({per_rank:,} on each of {self.replicas} --dp-size replicas)"
            ranks = self.replicas
        elif ranks > 1:
            name += f" ({per_rank:,} on each of {ranks} attention-DP ranks)"
        elif user is None:
            name += f" (SGLang's default for this pool, {per_rank:,})"
        elif per_rank != int(user):
            name += f" (SGLang lowers it to {per_rank:,} for this pool)"
        return (BatchCap(name, per_rank * ranks),)

    @classmethod
    def of(cls, server: Server, values: Mapping[str, Any]) -> Change:
        cap = server.cap
        fraction = float(values.get("mem_fraction_static", cap.mem_fraction_static))
        dtype = str(values.get("kv_cache_dtype", cap.kv_dtype))
        hicache = bool(values.get("enable_hierarchical_cache", server.hicache_on))
        bytes_new = cell_after(cap, dtype)
        if hicache and not server.hicache_on and swa_pool_off_with_hicache(server):
            attn_tp = max(1, server.info.tp_size // attn_dp_size(server.info))
            bytes_new = cell_without_swa_pool(cap, dtype, bytes_new, attn_tp)
        if fraction == cap.mem_fraction_static and bytes_new == cap.bytes_per_token:
            tokens = server.info.max_total_num_tokens
        else:
            tokens = cap.tokens_at(fraction, bytes_new)
        if "max_total_tokens" in values:
            tokens = min(tokens, int(values["max_total_tokens"]))
        ranks = attn_ranks_after(server, values)
        total = tokens * ranks * dp_replicas(server.info)
        return cls(server, dict(values), fraction, dtype, hicache, total, bytes_new, ranks)


def attn_ranks_after(server: Server, values: Mapping[str, Any]) -> int:
    """Attention-DP ranks after a change, in either spelling (0.5.23 `attn_dp_size`, older
    `enable_dp_attention` with `dp_size`)."""
    if "attn_dp_size" in values:
        return max(1, int(values["attn_dp_size"]))
    if values.get("enable_dp_attention"):
        return max(1, int(values.get("dp_size") or server.info.arg("dp_size") or 1))
    if values.get("enable_dp_attention") is False:
        return 1
    return attn_dp_size(server.info)


# Models whose hybrid SWA pool SGLang turns off with HiCache (0.5.10 server_args.py
# `_handle_model_specific_adjustments`, 0.5.23 `arg_groups/overrides.py`): model-path words and
# the releases that do it, [since, until).
Version = tuple[int, int, int]
SWA_OFF_WITH_HICACHE: tuple[tuple[tuple[str, ...], Version, Version | None], ...] = (
    (("step-3p5", "step3p5"), (0, 5, 10), None),
    (("mimo-v2-flash",), (0, 5, 10), (0, 5, 21)),
)


def model_words(model_path: object) -> str:
    return str(model_path or "").lower().replace("_", "-").replace(".", "p")


def swa_pool_off_with_hicache(server: Server) -> bool:
    model = model_words(server.info.arg("model_path"))
    return any(
        any(word in model for word in words)
        and server.version >= since
        and (until is None or server.version < until)
        for words, since, until in SWA_OFF_WITH_HICACHE
    )


def cell_without_swa_pool(
    cap: CapacityModel, dtype: str, fallback: float, attn_tp: int = 1
) -> float:
    """Bytes per token once the sliding-window layers keep full-length KV in the one pool:
    every attention layer at the full layers' cost (kvpilot needs the model's geometry)."""
    geometry = cap.geometry
    if geometry is None or not geometry.sliding_layers:
        return fallback
    per_layer = geometry.cell_bytes(dtype_bytes(dtype), attn_tp) / geometry.layers
    return per_layer * (geometry.layers + geometry.sliding_layers)


def cell_after(cap: CapacityModel, dtype: str) -> float:
    """Bytes per token with `dtype`: in proportion to the element size, except where the
    model's geometry says part of the cell does not shrink (DeepSeek's DSA indexer keys)."""
    now, new = dtype_bytes(cap.kv_dtype), dtype_bytes(dtype)
    if new == now:
        return cap.bytes_per_token
    geometry = cap.geometry
    if geometry is not None and geometry.kind == "dsa":
        return cap.bytes_per_token * geometry.cell_bytes(new) / geometry.cell_bytes(now)
    return cap.bytes_per_token * new / now


class Check(kit.Check[Change]):
    """A check of one SGLang launch argument: its halves judge SGLang's `Change`."""
