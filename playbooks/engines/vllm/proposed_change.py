"""One check per vLLM launch argument: a safety half and a usefulness half, kept apart.

Safety (will vLLM start, will it run out of GPU or host memory, does it cost accuracy) needs only
the server's facts, so a change is judged before anything is measured; usefulness (does it
address the bottleneck) reads a measurement. Each half answers with a `Finding`
(`playbooks.engines.findings`); `verdicts.py` combines them. Arguments interact (a new
utilization and a new KV dtype move the same pool; the token budget must cover the sequence
cap), so every check sees the whole `Change`. An argument no check covers is refused. The
checks of each argument, and the table that picks them, are in `argument_checks.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from playbooks.engines.findings import NOTHING, BatchCap, Finding
from playbooks.engines.kit import checks as kit
from playbooks.engines.kit.checks import Observed
from playbooks.engines.vllm.allow_list import AUTO
from playbooks.engines.vllm.capacity import (
    CapacityModel,
)
from playbooks.engines.vllm.facts import (
    Server,
    requests_fitting,
)

# Host memory kvpilot leaves to the rest of the host when sizing a KV offloading buffer: the API
# server, tokenizer workers and the page cache. vLLM pins the whole buffer
# (`cpu_bytes_to_use = size * 2**30`, config/vllm.py:1099-1133) and reserves nothing itself.
HOST_SHARE = 0.8
# CUDA graph sizes vLLM captures by default: up to min(512, 2 * max_num_seqs) for plain decoding
# (config/compilation.py:695-707, config/vllm.py:2292-2300).
DEFAULT_CAPTURE_CEILING = 512
OOM_RISK = "GPU OOM at start-up or under load"
# The arguments that move the KV pool.
POOL_ARGS = frozenset(
    {"gpu_memory_utilization", "kv_cache_dtype", "block_size", "kv_cache_memory_bytes"}
)


@dataclass(frozen=True)
class Change:
    """A proposed change and what follows from it before any measurement."""

    server: Server
    values: Mapping[str, Any]
    utilization: float  # gpu_memory_utilization after the change
    dtype: str  # kv_cache_dtype after the change (`auto` resolved as the pool has it)
    block_size: int
    kv_bytes: int | None  # kv_cache_memory_bytes after the change
    max_model_len: int | None  # after the change (AUTO: vLLM fits it)
    tokens: int | None  # predicted KV capacity over all engines; None where unpredictable

    @property
    def cap(self) -> CapacityModel:
        return self.server.cap

    @property
    def current(self) -> int:
        return self.server.info.capacity_tokens

    def after(self, name: str) -> Any:
        """An argument's value after the change (today's where the change leaves it)."""
        if name in self.values:
            return self.values[name]
        return self.server.info.arg(name)

    @property
    def grows_pool(self) -> bool:
        return self.tokens is not None and self.tokens > self.current

    @property
    def batch_caps(self) -> tuple[BatchCap, ...]:
        """The caps on the running batch after the change, over all engines, where known. Each
        data-parallel engine builds its own scheduler from the one config (v1/engine/core.py
        `EngineCore.__init__`), which admits up to `max_num_seqs` (v1/core/sched/scheduler.py
        `Scheduler.schedule`: the waiting loop stops at `max_num_running_reqs`) and schedules
        at most `max_num_batched_tokens` tokens a step, one per decoding request
        (`token_budget`); vLLM 0.32 refuses a budget below the sequence cap
        (config/scheduler.py), so the budget binds only where the cap is not known."""
        engines = self.server.info.engines
        where = f" on each of {engines} engines" if engines > 1 else ""
        caps = []
        for name, what in (
            ("max_num_seqs", ""),
            ("max_num_batched_tokens", " (one token a step for each running request)"),
        ):
            value = self.after(name)
            if isinstance(value, int) and not isinstance(value, bool):
                caps.append(BatchCap(f"{name}={value}{what}{where}", value * engines))
        return tuple(caps)

    @classmethod
    def of(cls, server: Server, values: Mapping[str, Any]) -> Change:
        cap = server.cap

        def given(name: str, now: Any) -> Any:  # None in a change removes the flag: vLLM's own
            return values[name] if values.get(name) is not None else now

        utilization = float(given("gpu_memory_utilization", cap.utilization))
        dtype = str(given("kv_cache_dtype", cap.kv_dtype))
        if dtype == "auto" and server.cap.kv_dtype != "auto":
            dtype = server.cap.kv_dtype  # the checkpoint's FP8 scheme still applies
        block_size = int(given("block_size", cap.block_size))
        kv_bytes = given("kv_cache_memory_bytes", cap.kv_bytes_flag)
        length = given("max_model_len", server.info.arg("max_model_len"))
        tokens: int | None = server.info.capacity_tokens
        if POOL_ARGS & set(values):
            new_bytes = values.get("kv_cache_memory_bytes")
            tokens = cap.tokens_after(
                utilization, dtype, block_size, None if new_bytes is None else int(new_bytes)
            )
        return cls(
            server,
            dict(values),
            utilization,
            dtype,
            block_size,
            None if kv_bytes is None else int(kv_bytes),
            None if length is None else int(length),
            tokens,
        )


class Check(kit.Check[Change]):
    """A check of one vLLM launch argument: its halves judge vLLM's `Change`."""


def capacity_usefulness(ctx: Change, seen: Observed, what: str) -> Finding:
    """Whether a change that moves the KV pool helps: it must grow, and KV must be the limit."""
    tokens, current = ctx.tokens, ctx.current
    pinned = ctx.cap.blocks_override
    if pinned is not None:
        return Finding(
            "not_useful",
            (f"num_gpu_blocks_override pins the KV cache at {pinned} blocks whatever the memory",),
        )
    if tokens is None:
        if not seen.kv_bound:
            return Finding(
                "not_useful", (f"the bottleneck is {seen.bottleneck}, not the KV cache",)
            )
        return Finding(
            "possible",
            (
                f"{what} grows the KV cache, by an amount kvpilot cannot put in tokens here "
                "(it needs the GPU's memory and the model's config.json); the experiment "
                "measures it",
            ),
        )
    refused = kit.capacity_grows(tokens, current, seen)
    if refused is not None:
        return refused
    m = seen.m
    fit = ""
    if m.avg_prompt_tokens is not None:
        fitting = requests_fitting(ctx.server.info, m, tokens) or 0
        fit = f"; ~{fitting:.0f} requests of the observed size fit"
    grown = f"capacity {current:,} -> {tokens:,} tokens (+{tokens / max(1, current) - 1:.0%}){fit}"
    return Finding(
        "recommended",
        (grown,),
        (f"{m.running + m.queued:.0f} in-flight requests are dropped by the restart",),
    )


class StartsCheck(Check):
    """Whatever moves the pool or the model length must leave a length vLLM accepts and room
    for one full-length request, or vLLM refuses to start: a --max-model-len above the model's
    own context length (config/model.py `get_and_verify_max_len`, "User-specified max_model_len
    ... is greater than the derived max_model_len"), or a pool that cannot hold one request of
    it (`_check_enough_kv_cache_memory`)."""

    names = (*sorted(POOL_ARGS), "max_model_len")

    def safety(self, ctx: Change, value: Any) -> Finding:
        length = ctx.max_model_len
        geometry = ctx.cap.geometry
        limit = geometry.max_positions if geometry is not None else None
        if "max_model_len" in ctx.values and length and limit and length > limit:
            return Finding(
                "unsafe",
                (
                    f"max_model_len {length:,} is above the model's own context length "
                    f"({limit:,}, max_position_embeddings): vLLM refuses to start",
                ),
            )
        tokens = ctx.tokens
        if tokens is None:
            return NOTHING
        if tokens <= 0:
            return Finding(
                "unsafe",
                (
                    "no KV cache would be left: vLLM refuses to start (no available memory "
                    "for the cache blocks)",
                ),
            )
        if length is None or length == AUTO or ctx.cap.one_request_fits(tokens, length):
            return NOTHING
        return Finding(
            "unsafe",
            (
                f"{tokens // ctx.server.info.engines:,} tokens of KV cache per engine cannot "
                f"hold one request of max_model_len {length:,}: vLLM refuses to start",
            ),
        )
