"""The check of each vLLM launch argument kvpilot may change, and the table that picks them.

The shared parts (the `Change` every check sees, the `Check` halves, the start-up check every
pool-moving argument gets) are in `proposed_change.py`; here is what each argument's safety and
usefulness mean, in vLLM's terms, with the source each limit comes from.

Why it is long: one check per vLLM launch argument kvpilot judges, each with its two halves and
its sources cited, and the table that finds them.
"""

from __future__ import annotations

from typing import Any

from playbooks.engines.findings import NOTHING, Finding
from playbooks.engines.kit import checks as kit
from playbooks.engines.kit.checks import Observed
from playbooks.engines.types import Verdict
from playbooks.engines.vllm.capacity import (
    GIB,
    HIGHEST_UTILIZATION,
    RECOMMENDED_UTILIZATION,
    dtype_bytes,
)
from playbooks.engines.vllm.facts import (
    PREEMPTIONS_PER_MIN_HIGH,
    Server,
    preemption_rate,
    preempts_often,
    prefix_heavy,
    seq_cap_total,
)
from playbooks.engines.vllm.proposed_change import (
    DEFAULT_CAPTURE_CEILING,
    HOST_SHARE,
    OOM_RISK,
    Change,
    Check,
    StartsCheck,
    capacity_usefulness,
)
from playbooks.engines.vllm.shared_gpu import (
    StartLimit,
    highest_that_starts,
    ranks_of,
    start_limit,
    two_decimals_down,
)


class UtilizationCheck(Check):
    """gpu_memory_utilization: the share of the GPU's total memory vLLM's whole budget takes;
    everything but the KV cache is profiled inside it, so a higher share is all KV, and the
    rest of the GPU is the headroom for what the profile does not see."""

    names = ("gpu_memory_utilization",)

    def applies(self, change: Change) -> bool:
        return change.utilization != change.cap.utilization and "gpu_memory_utilization" in (
            change.values
        )

    def safety(self, ctx: Change, value: Any) -> Finding:
        u, cap = float(value), ctx.cap
        if cap.sized_by_bytes:
            return NOTHING
        found = self.budget(ctx, u)
        start = starts_on_shared_gpu(ctx, u)
        if start.verdict == "unsafe" or (start.verdict and found.verdict in (None, "recommended")):
            return Finding(start.verdict, found.reasons + start.reasons, found.risks + start.risks)
        return found

    def budget(self, ctx: Change, u: float) -> Finding:
        """What the share left outside vLLM's budget says."""
        cap = ctx.cap
        headroom = cap.headroom_gib(u)
        left = f"{1 - u:.0%} of the GPU" + (
            f" ({headroom:.1f} GiB)" if headroom is not None else ""
        )
        if u > HIGHEST_UTILIZATION:
            return Finding(
                "unsafe",
                (
                    f"{u:g} leaves {left} outside vLLM's budget, less than at "
                    f"{HIGHEST_UTILIZATION:g}, where vLLM's own tuner starts its search "
                    "(benchmarks/auto_tune): the CUDA context, allocator fragmentation and "
                    "anything else on the GPU must fit there",
                ),
                (OOM_RISK,),
            )
        if u > RECOMMENDED_UTILIZATION and u > cap.utilization:
            return Finding(
                "possible",
                (
                    f"{u:g} leaves {left} outside vLLM's budget, below the 5% kvpilot "
                    "recommends keeping for what vLLM's memory profile does not see",
                ),
                (f"{OOM_RISK} if anything else takes GPU memory",),
            )
        return Finding(reasons=(f"{u:g} leaves {left} outside vLLM's budget",))

    def usefulness(self, ctx: Change, value: Any, seen: Observed) -> Finding:
        if ctx.cap.sized_by_bytes:
            return Finding(
                "not_useful",
                (
                    "the server sizes its KV cache with kv_cache_memory_bytes, which vLLM "
                    "follows instead of gpu_memory_utilization (v1/worker/gpu_worker.py): "
                    "change that instead",
                ),
            )
        return capacity_usefulness(ctx, seen, f"gpu_memory_utilization {value:g}")


def server_start_limit(server: Server) -> StartLimit | None:
    """What the GPUs the server may run on let it start with (None: not known here)."""
    cap, info = server.cap, server.info
    if cap.gpu is None or not cap.gpu.gpus or cap.sized_by_bytes:
        return None
    pp = int(info.arg("pipeline_parallel_size", 1) or 1)
    return start_limit(cap.utilization, cap.gpu.gpus, ranks_of(info.tp_size, pp, info.engines))


def starts_on_shared_gpu(ctx: Change, u: float) -> Finding:
    """Whether vLLM can start at `u` with what the GPUs it may run on have free now."""
    if u <= ctx.cap.utilization:
        return NOTHING
    limit = server_start_limit(ctx.server)
    if limit is None or u <= limit.worst + 1e-9:
        return NOTHING
    asks = f"at {u:g} vLLM asks for {u * limit.total_gib:.1f} GiB free on startup"
    if u > limit.highest + 1e-9:
        return Finding(
            "unsafe",
            (
                f"vLLM refuses to start: {asks}, and its GPU would have "
                f"{limit.total_gib - limit.others_gib:.1f} GiB ({limit.others_gib:.1f} GiB are "
                f"held beside this server's budget now; {limit.free_gib:.1f} GiB free): at most "
                f"{highest_that_starts(limit):.2f} starts (v1/worker/utils.py "
                "`request_memory`)",
            ),
            ("the restart fails to start and is reverted",),
        )
    return Finding(
        "possible",
        (
            f"{asks}; one of the GPUs it may run on has {limit.worst_others_gib:.1f} GiB held "
            f"beside its budget, where at most {two_decimals_down(limit.worst):.2f} starts",
        ),
        ("vLLM refuses to start if the server runs on that GPU (then the change is reverted)",),
    )


class KvBytesCheck(Check):
    """kv_cache_memory_bytes: the KV cache's size per GPU, taken as given: vLLM still profiles,
    but checks nothing against the GPU's memory (v1/worker/gpu_worker.py:648-671)."""

    names = ("kv_cache_memory_bytes",)

    def safety(self, ctx: Change, value: Any) -> Finding:
        cap, new_gib = ctx.cap, int(value) / GIB
        now = cap.kv_gib
        if now is not None and new_gib <= now:
            return NOTHING
        non_kv = cap.non_kv_gib
        if cap.gpu is None or non_kv is None:
            return Finding(
                "possible",
                (
                    f"{new_gib:.2f} GiB of KV cache per GPU: vLLM does not check it against the "
                    "GPU's memory, and kvpilot does not know what the weights, activations and "
                    "graphs take beside it",
                ),
                (f"{OOM_RISK} if they do not fit beside it",),
            )
        share = (non_kv + new_gib) / cap.gpu.total_gib
        verdict: Verdict | None = None
        if share > HIGHEST_UTILIZATION:
            verdict = "unsafe"
        elif share > RECOMMENDED_UTILIZATION:
            verdict = "possible"
        return Finding(
            verdict,
            (
                f"{new_gib:.2f} GiB of KV cache beside {non_kv:.2f} GiB of weights, activations "
                f"and graphs is {share:.0%} of the GPU's {cap.gpu.total_gib:.1f} GiB",
            ),
            (OOM_RISK,) if verdict else (),
        )

    def usefulness(self, ctx: Change, value: Any, seen: Observed) -> Finding:
        return capacity_usefulness(ctx, seen, f"kv_cache_memory_bytes {int(value):,}")


class KvDtypeCheck(Check):
    """kv_cache_dtype: an 8-bit element halves a block's bytes, at some cost in answer quality."""

    names = ("kv_cache_dtype",)

    def shrinks(self, ctx: Change) -> bool:
        return dtype_bytes(ctx.dtype) < dtype_bytes(ctx.cap.kv_dtype)

    def safety(self, ctx: Change, value: Any) -> Finding:
        if not self.shrinks(ctx):
            return NOTHING
        tokens = "an unknown number of" if ctx.tokens is None else f"{ctx.tokens:,}"
        return Finding(
            "needs_opt_in",
            (
                f"{value} halves the bytes per token: {ctx.current:,} -> {tokens} tokens",
                "FP8 KV costs accuracy: without calibrated scales in the checkpoint vLLM uses "
                "a scale of 1.0, and hard reasoning evals lose a few points; the attention "
                "backend must support it too; only with an explicit opt-in",
            ),
            ("answer quality",),
        )

    def usefulness(self, ctx: Change, value: Any, seen: Observed) -> Finding:
        if not self.shrinks(ctx):
            named = str(ctx.server.info.arg("kv_cache_dtype", "auto"))
            already = (
                " (the checkpoint's `auto` is already FP8)" if ctx.cap.kv_dtype != named else ""
            )
            return Finding("not_useful", (f"{value} does not shrink the KV cache{already}",))
        return capacity_usefulness(ctx, seen, f"kv_cache_dtype {value}")


class SeqCapCheck(Check):
    """max_num_seqs: each engine's cap on running requests. It helps where the batch sits at
    it; lowered, it is vLLM's own advice against frequent preemption."""

    names = ("max_num_seqs",)
    predicts_gain = False

    def safety(self, ctx: Change, value: Any) -> Finding:
        budget = ctx.after("max_num_batched_tokens")
        if isinstance(budget, int) and int(value) > budget:
            return Finding(
                "unsafe",
                (
                    f"max_num_seqs {value} is above max_num_batched_tokens {budget}: vLLM "
                    "refuses to start (config/scheduler.py)",
                ),
            )
        now = ctx.server.info.arg("max_num_seqs")
        if isinstance(now, int) and int(value) > now and not ctx.after("enforce_eager"):
            return Finding(
                reasons=(
                    "more sequences mean larger CUDA graphs captured (up to "
                    f"{DEFAULT_CAPTURE_CEILING} by default), whose memory vLLM takes from the "
                    "KV cache at start-up",
                )
            )
        return NOTHING

    def predicts_gain_for(self, change: Change) -> bool:
        """Beside a larger pool the gain is the pool's, bounded by the cap after the change."""
        return change.grows_pool

    def usefulness(self, ctx: Change, value: Any, seen: Observed) -> Finding:
        after = int(value) * ctx.server.info.engines
        if seen.kv_bound and ctx.grows_pool and after > seen.m.running:
            return Finding(reasons=(f"up to {after:,} requests may run in the larger pool",))
        limit = seq_cap_total(ctx.server.info)
        per_engine = ctx.server.info.arg("max_num_seqs")
        if limit is None or not isinstance(per_engine, int):
            return Finding(
                "possible" if seen.bottleneck == "compute" else "not_useful",
                ("max_num_seqs today is not known, so kvpilot cannot say whether it binds",),
            )
        if seen.bottleneck == "compute" and int(value) > per_engine:
            return Finding(
                "possible", (f"the batch sits at the cap of {limit} while the KV cache has room",)
            )
        rpm = preemption_rate(seen.m) or 0.0
        if seen.kv_bound and int(value) < per_engine and rpm > PREEMPTIONS_PER_MIN_HIGH:
            return Finding(
                "possible",
                (
                    f"{rpm:.1f} preemptions/min recompute requests from the start; vLLM's guide "
                    "advises fewer concurrent sequences against frequent preemption: fewer run, "
                    "but fewer are thrown away",
                ),
                ("fewer requests run at once",),
            )
        if after < seen.m.running:
            return Finding(
                "not_useful",
                (
                    f"a cap of {after:,} running requests is below the {seen.m.running:.0f} "
                    "running now: the batch shrinks to it, and the decode rate with it",
                ),
            )
        return Finding("not_useful", ("the sequence cap does not limit this server now",))


class TokenBudgetCheck(Check):
    """max_num_batched_tokens: the tokens one step may schedule. vLLM's memory profile runs a
    batch of this many tokens, so its activation peak, and what the KV cache does not get,
    grow with it (gpu_model_runner.py `profile_run`)."""

    names = ("max_num_batched_tokens",)
    predicts_gain = False

    def safety(self, ctx: Change, value: Any) -> Finding:
        seqs = ctx.after("max_num_seqs")
        if isinstance(seqs, int) and int(value) < seqs:
            return Finding(
                "unsafe",
                (
                    f"max_num_batched_tokens {value} is below max_num_seqs {seqs}: vLLM "
                    "refuses to start (config/scheduler.py)",
                ),
            )
        length = ctx.max_model_len
        chunked = ctx.after("enable_chunked_prefill")
        if chunked is False and length and length > 0 and int(value) < length:
            return Finding(
                "unsafe",
                (
                    f"with chunked prefill off, max_num_batched_tokens must be at least "
                    f"max_model_len ({length:,}): vLLM refuses to start",
                ),
            )
        now = ctx.server.info.arg("max_num_batched_tokens")
        if isinstance(now, int) and int(value) > now:
            return Finding(
                reasons=(
                    "vLLM profiles a step of this many tokens at start-up and takes its "
                    "activation peak from the KV cache, so the cache shrinks by an amount "
                    "kvpilot does not predict (it does not run out of memory for it)",
                ),
                risks=("a smaller KV cache",),
            )
        return NOTHING

    def usefulness(self, ctx: Change, value: Any, seen: Observed) -> Finding:
        now = ctx.server.info.arg("max_num_batched_tokens")
        if not isinstance(now, int):
            return Finding(
                "not_useful",
                ("max_num_batched_tokens today is not known, so kvpilot cannot compare",),
            )
        if seen.bottleneck == "prefill" and int(value) > now:
            return Finding(
                "possible",
                (
                    "prefill limits throughput; vLLM's guide recommends a budget above 8192 for "
                    "throughput (larger budgets shorten time to first token, at some cost in "
                    "inter-token latency)",
                ),
            )
        if seen.kv_bound and int(value) < now:
            return Finding(
                "possible",
                (
                    "a smaller step budget shrinks the activation peak vLLM reserves, which "
                    "goes to the KV cache (the gain is measured, not predicted); prompts take "
                    "more steps to prefill",
                ),
                ("longer time to first token",),
            )
        return Finding("not_useful", ("the step's token budget does not limit this server",))


class EagerCheck(Check):
    """enforce_eager: no CUDA graphs (and in 0.32 no torch.compile), so their memory goes to the
    KV cache; every decode step then launches its kernels one by one."""

    names = ("enforce_eager",)
    predicts_gain = False

    def usefulness(self, ctx: Change, value: Any, seen: Observed) -> Finding:
        now = bool(ctx.server.info.arg("enforce_eager", False))
        if bool(value) == now:
            return Finding("not_useful", (f"enforce_eager is already {str(now).lower()}",))
        if value and seen.kv_bound:
            return Finding(
                "possible",
                (
                    "the CUDA graphs' memory, which vLLM takes from the KV cache at start-up, "
                    "goes to the KV cache instead (vLLM does not export how much: the "
                    "experiment measures it); each decode step runs slower",
                ),
                ("slower decode steps",),
            )
        if not value and seen.bottleneck == "compute":
            return Finding(
                "possible",
                ("CUDA graphs speed up decode steps, at the cost of some KV cache",),
                ("a smaller KV cache",),
            )
        return Finding("not_useful", ("eager execution is not what limits this server",))


class GraphSizeCheck(Check):
    """max_cudagraph_capture_size: decode batches up to it replay captured graphs, larger ones
    run eagerly; the graphs' memory comes out of the KV cache at start-up (since v0.21)."""

    names = ("max_cudagraph_capture_size",)
    predicts_gain = False

    def now(self, ctx: Change) -> int | None:
        value = ctx.server.info.arg("max_cudagraph_capture_size")
        if isinstance(value, int):
            return value
        seqs = ctx.server.info.arg("max_num_seqs")
        return min(DEFAULT_CAPTURE_CEILING, 2 * seqs) if isinstance(seqs, int) else None

    def usefulness(self, ctx: Change, value: Any, seen: Observed) -> Finding:
        if ctx.after("enforce_eager"):
            return Finding("not_useful", ("with enforce_eager no CUDA graphs are captured",))
        now = self.now(ctx)
        if now is None:
            return Finding("not_useful", ("the capture size today is not known",))
        per_engine = seen.m.running / max(1, ctx.server.info.engines)
        if int(value) > now and per_engine > now and seen.bottleneck == "compute":
            return Finding(
                "possible",
                (
                    f"~{per_engine:.0f} requests decode per engine, above the {now} the graphs "
                    f"cover, so those steps run eagerly; graphs up to {value} cover them",
                ),
                ("a smaller KV cache",),
            )
        if int(value) < now and seen.kv_bound:
            return Finding(
                "possible",
                (
                    f"graphs only up to {value} take less memory, which goes to the KV cache; "
                    "larger decode batches run eagerly",
                ),
                ("slower decode steps for large batches",),
            )
        return Finding("not_useful", (f"the decode batch (~{per_engine:.0f}) is not the limit",))


class OffloadCheck(Check):
    """kv_offloading_size: a host-RAM tier for KV blocks (vLLM's OffloadingConnector). Offloaded
    blocks come back only on a prefix hit; running requests still need their blocks on the
    GPU, so it helps prefix reuse, not a pool full of running requests."""

    names = ("kv_offloading_size", "kv_offloading_backend")
    predicts_gain = False

    def value(self, change: Change) -> Any:
        return change.after("kv_offloading_size")

    def safety(self, ctx: Change, value: Any) -> Finding:
        if value is None:
            return Finding(
                "not_useful", ("kv_offloading_backend alone does nothing without a size",)
            )
        host = ctx.server.host
        if host is None:
            return Finding(
                "unsafe",
                (
                    "host RAM is unknown (configure host_ram_gib or run on the GPU host), so "
                    f"{float(value):g} GiB of pinned host memory cannot be checked against it",
                ),
                ("host OOM",),
            )
        budget = host.available_gib * HOST_SHARE
        engines = max(1, ctx.server.info.engines)
        pinned = float(value) * engines
        # vLLM gives each data-parallel engine the whole size and divides it over that
        # engine's TP x PP ranks only (v1/kv_offload/cpu/spec.py: bytes per block times
        # `parallel_config.world_size`, which leaves DP out)
        per_engine = (
            f" (vLLM pins it once per data-parallel engine: {engines} x {float(value):g} GiB = "
            f"{pinned:g} GiB)"
            if engines > 1
            else ""
        )
        if pinned > budget:
            return Finding(
                "unsafe",
                (
                    f"{float(value):g} GiB of pinned host memory{per_engine} is more than "
                    f"{budget:.1f} GiB ({HOST_SHARE:.0%} of the {host.available_gib:.1f} GiB "
                    "available): the kernel's OOM killer ends the server",
                ),
                ("host OOM",),
            )
        found = [
            f"{pinned:g} GiB pinned over {engines} data-parallel engines, of "
            f"{host.available_gib:.1f} GiB of host RAM available"
            if engines > 1
            else f"{float(value):g} GiB of {host.available_gib:.1f} GiB of host RAM available"
        ]
        if ctx.after("kv_offloading_backend") == "lmcache":
            found.append(
                "with the lmcache backend vLLM does not pass the size on: LMCache's own server "
                "must be running and sized (config/vllm.py)"
            )
        return Finding(reasons=tuple(found))

    def usefulness(self, ctx: Change, value: Any, seen: Observed) -> Finding:
        m = seen.m
        if seen.kv_bound and prefix_heavy(m):
            return Finding(
                "possible",
                (
                    f"{m.cached_fraction or 0:.0%} of prompt tokens came from the prefix cache "
                    "and prompts dominate: prefixes evicted from the GPU come back from host "
                    "RAM instead of being computed again",
                ),
            )
        rpm = preemption_rate(m)
        if seen.kv_bound and preempts_often(m):
            return Finding(
                "possible",
                (
                    f"{rpm:.1f} preemptions/min: vLLM computes a preempted request again from "
                    "the start, and with KV offloading its stored blocks are flushed to the CPU "
                    "when it is preempted and found again when it returns "
                    "(kv_connector/v1/offloading/scheduler.py), so it may pay without prefix "
                    "reuse; the experiment measures whether it does",
                ),
                ("each step's blocks are also copied to the CPU",),
            )
        return Finding(
            "not_useful",
            (
                "KV offloading serves prefix hits and preempted requests' return only: running "
                "requests still need their blocks on the GPU, and this workload neither reuses "
                "prefixes enough nor preempts often",
            ),
        )


class PrefixCachingCheck(Check):
    """enable_prefix_caching: cached blocks nobody references count as free and are evicted on
    demand, so prefix caching costs no capacity; turning it off only loses hits."""

    names = ("enable_prefix_caching",)
    predicts_gain = False

    def usefulness(self, ctx: Change, value: Any, seen: Observed) -> Finding:
        if value:
            if ctx.server.info.arg("enable_prefix_caching", True):
                return Finding("not_useful", ("prefix caching is already on",))
            return Finding(
                "possible", ("shared prompt prefixes are then computed once and reused",)
            )
        share = seen.m.cached_fraction or 0.0
        return Finding(
            "not_useful",
            (
                f"turning prefix caching off frees no KV (cached blocks are evicted on demand) "
                f"and loses the {share:.0%} of prompt tokens it serves",
            ),
        )


class RideAlongCheck(Check):
    """An argument that does not raise KV capacity: it decides a verdict only on its own."""

    fallback = True
    predicts_gain = False

    def __init__(self, name: str, why: str) -> None:
        self.names = (name,)
        self.why = why

    def usefulness(self, ctx: Change, value: Any, seen: Observed) -> Finding:
        return Finding("not_useful", (self.why,))


# Argument name -> its check, in the order their reasons are listed. StartsCheck applies to
# every argument that moves the pool and is listed first, where a change that cannot start is
# refused before anything else is said.
STARTS = StartsCheck()
CHECKS: dict[str, kit.Check[Change]] = kit.table(
    (
        UtilizationCheck(),
        KvBytesCheck(),
        KvDtypeCheck(),
        SeqCapCheck(),
        TokenBudgetCheck(),
        OffloadCheck(),
        EagerCheck(),
        GraphSizeCheck(),
        PrefixCachingCheck(),
        RideAlongCheck(
            "max_model_len",
            "vLLM sizes the KV cache from memory, not from max_model_len: a shorter one adds "
            "no blocks",
        ),
        RideAlongCheck(
            "block_size", "a block of another size holds the same bytes: no more capacity"
        ),
    )
)


def checks_for(change: Change) -> list[kit.Check[Change]]:
    """The checks a change calls on, each once: whether it starts, then the table's in table
    order; unknown arguments last."""
    return kit.checks_for(CHECKS, change, first=(STARTS,))
