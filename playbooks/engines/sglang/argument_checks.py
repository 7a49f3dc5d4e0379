"""One check per launch argument kvpilot may change, and the table that finds them by name.

The table's order is the order a verdict's reasons are listed in. An argument the table does not
name gets `UnknownArgument`: kvpilot cannot call a change safe that it has no rule for.

Why it is long: one check per SGLang launch argument kvpilot judges (about twenty, each with its
two halves and its sources cited), and the table that finds them; split by argument, the table
would import them all back.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from playbooks.engines.kit import checks as kit
from playbooks.engines.kit.checks import Observed
from playbooks.engines.kit.verdicts import pool_room
from playbooks.engines.sglang.capacity import ACTIVATION_FLOOR_GIB
from playbooks.engines.sglang.deployment import decode_max_bs
from playbooks.engines.sglang.facts import (
    RETRACTIONS_PER_MIN_HIGH,
    SATURATED_USAGE,
    conservativeness,
    conservativeness_scale,
    context_len,
    grammar_waiting,
    requests_fitting,
    reservation_binding,
    retraction_rate,
    running_cap_total,
)
from playbooks.engines.sglang.hicache import HostPoolCheck
from playbooks.engines.sglang.host_tier import PROMPT_HEAVY
from playbooks.engines.sglang.metrics import binding_pool_of
from playbooks.engines.sglang.proposed_change import NOTHING, Change, Check, Finding, dtype_bytes
from playbooks.engines.sglang.reservation import CONSERVATIVENESS_SATURATION, initial_ratio
from playbooks.engines.sglang.reserve import Deployment, sglang_reserve
from playbooks.engines.types import Measurement

DEFAULT_CHUNK = 8192  # SGLang's chunked_prefill_size when the server reports none
MIN_CHUNK = 2048  # activation memory stops shrinking with the chunk below this


def moves_fraction(ctx: Change) -> bool:
    """A fraction in the change that differs from today's; the same value only pins it."""
    return "mem_fraction_static" in ctx.values and ctx.fraction != ctx.cap.mem_fraction_static


def takes_no_more_memory(ctx: Change) -> bool:
    """The change leaves at least as much outside the pool as the running server has: what the
    server runs with now is evidence, so such a change is not judged to run out of memory."""
    cap = ctx.cap
    return cap.outside_gib(ctx.fraction, ctx.bytes_per_token, ctx.hicache) >= cap.outside_now_gib


def activation_room(ctx: Change) -> Finding:
    """Unsafe where the change leaves the KV pool no room, or activations too little."""
    cap, fraction = ctx.cap, ctx.fraction
    if fraction <= cap.min_fraction():
        return Finding(
            "unsafe",
            (
                f"at {fraction:g} the weights leave no room for the KV cache: SGLang "
                f"refuses to start below ~{cap.min_fraction():.3f}",
            ),
        )
    room = cap.activation_room_gib(fraction, ctx.hicache, ctx.bytes_per_token)
    if room >= ACTIVATION_FLOOR_GIB or takes_no_more_memory(ctx):
        return NOTHING
    outside = cap.outside_gib(fraction, ctx.bytes_per_token, ctx.hicache)
    if not cap.gpu.exact and cap.max_total_tokens_cap is not None:
        # GPU memory estimated from the split, which a capped pool makes far too small: no
        # evidence that the server lacks room, so kvpilot says what it does not know.
        return Finding(
            "possible",
            (
                f"GPU memory is not known and the pool is capped by --max-total-tokens, so the "
                f"estimate from the server's split ({cap.gpu.pre_gib:.1f} GiB) is a lower bound "
                f"and the {room:.2f} GiB it leaves for activations says nothing: set "
                "gpu_memory_gib (or run SGLang 0.5.17+, which reports startup_available)",
            ),
            ("GPU OOM if the GPU really is that small",),
        )
    graphs = cap.graphs_at(fraction, ctx.hicache, ctx.bytes_per_token)
    return Finding(
        "unsafe",
        (
            f"{fraction:g} leaves {outside:.2f} GiB outside the weights and the KV pool; "
            f"CUDA graphs take {graphs:.2f} GiB"
            + (" and the hierarchical cache's buffers 0.50 GiB" if ctx.hicache else "")
            + f", so {room:.2f} GiB remain for activations, below the "
            f"{ACTIVATION_FLOOR_GIB:g} GiB floor kvpilot keeps for them (SGLang's tuning guide "
            "asks for 5-8 GB; {:.2f} GiB short of it): it may start, then run out of GPU "
            "memory under a large prefill".format(ACTIVATION_FLOOR_GIB - room),
            *prefill_graph_notes(ctx),
        ),
        ("GPU OOM under load",),
    )


def prefill_graph_notes(ctx: Change) -> tuple[str, ...]:
    """What SGLang 0.5.16-0.5.17 will do with its prefill CUDA graph at the change's fraction,
    where that differs from today: skip it (the server starts and prefills without it, which
    frees its memory and slows prefill), or capture it again (its size is not known here)."""
    cap, fraction = ctx.cap, ctx.fraction
    gate = cap.prefill_graph_gate_gib
    if gate is None:
        return ()
    free = cap.outside_gib(fraction, ctx.bytes_per_token, ctx.hicache)
    version = ctx.server.info.version
    if cap.prefill_graph_skipped(fraction, ctx.hicache, ctx.bytes_per_token):
        if cap.prefill_graph_gib == 0.0:
            return ()  # skipped today too
        return (
            f"SGLang {version} captures no prefill CUDA graph with less than {gate:g} GiB free "
            f"after allocation ({free:.2f} GiB at {fraction:g}): it starts and prefills "
            f"without it (slower prefill), and the graph's {cap.prefill_graph_gib:.2f} GiB "
            "stay free for activations",
        )
    if cap.prefill_graph_returns(fraction, ctx.hicache):
        return (
            f"SGLang {version} skipped its prefill CUDA graph on this server and captures it "
            f"again at {fraction:g} ({free:.2f} GiB free, at least {gate:g} needed): its memory, "
            "not known from this server (1.47 GiB for an 8B model's 8,192-token chunks on an "
            "H100 and an H200), comes out of the room for activations",
        )
    return ()


def chunk_after(ctx: Change) -> int | None:
    """The prefill chunk the change sets (the flag, over all attention-DP ranks), if any."""
    value = ctx.values.get("chunked_prefill_size")
    return None if value is None else int(value)


def reserve_floor(ctx: Change) -> Finding:
    """`possible`, not `recommended`, where less than SGLang's own default reserve (for the
    deployment as changed: a smaller prefill chunk lowers it) stays outside the pool. Real
    activation peaks differ from any model (kernels, fragmentation, drivers), which is why SGLang
    reserves more than its rule of thumb; a fraction past its reserve starts and may run for
    hours, then a peak batch finds too little room."""
    cap = ctx.cap
    reserve = cap.reserve_with(chunk_after(ctx))
    if reserve is None or takes_no_more_memory(ctx):
        return NOTHING
    outside = cap.outside_gib(ctx.fraction, ctx.bytes_per_token, ctx.hicache)
    if outside >= reserve.total_gib:
        return NOTHING
    chunk = chunk_after(ctx)
    deployment = "this GPU and deployment" + (f" with chunk {chunk}" if chunk else "")
    below_floor = outside < reserve.floor_gib
    return Finding(
        "possible",
        (
            f"{ctx.fraction:g} keeps {outside:.2f} GiB outside the weights and the KV pool, "
            f"below the {reserve.total_gib:.2f} GiB SGLang's own default fraction keeps on "
            f"{deployment} ({reserve.activation_mib / 1024:.1f} GiB of it for prefill "
            f"activations"
            + (f"; below even its {reserve.floor_gib:.2f} GiB floor" if below_floor else "")
            + ")",
        ),
        (
            f"GPU OOM at a peak: {reserve.total_gib - outside:.2f} GiB less headroom than "
            "SGLang's own default",
        ),
    )


def dp_padding_gib(ctx: Change, ranks: int) -> float:
    """The CUDA-graph padding SGLang reserves for `ranks` attention-DP ranks, beyond today's."""
    reserve = ctx.cap.reserve
    if reserve is None:
        return 0.0
    gpu_mib = ctx.cap.gpu.total_mib or ctx.cap.gpu.pre_gib * 1024
    base = Deployment(gpu_mib=gpu_mib, decode_max_bs=decode_bs(ctx), prefill_graphs=False)
    now = sglang_reserve(replace(base, attn_dp=ctx.ranks_now)).graph_mib
    return (sglang_reserve(replace(base, attn_dp=ranks)).graph_mib - now) / 1024


def decode_bs(ctx: Change) -> int:
    return decode_max_bs(ctx.server.info, ctx.cap.gpu.total_mib or ctx.cap.gpu.pre_gib * 1024)


class StaticPoolCheck(Check):
    """mem_fraction_static: the GPU share of weights and KV pool; the rest holds activations.

    Enabling the hierarchical cache is checked here too: its buffers take from the same room.
    """

    names = ("mem_fraction_static",)

    def applies(self, change: Change) -> bool:
        enables_hicache = "enable_hierarchical_cache" in change.values and change.hicache
        return moves_fraction(change) or enables_hicache

    def safety(self, ctx: Change, value: Any) -> Finding:
        found = activation_room(ctx)
        if found.verdict is None:
            found = reserve_floor(ctx)
        if found.verdict is not None or not moves_fraction(ctx):
            return found
        cap = ctx.cap
        room = cap.activation_room_gib(ctx.fraction, ctx.hicache, ctx.bytes_per_token)
        graphs = cap.graphs_at(ctx.fraction, ctx.hicache, ctx.bytes_per_token)
        kept = f"{ctx.fraction:g} keeps {room:.2f} GiB for activations after {graphs:.2f} GiB "
        if room >= ACTIVATION_FLOOR_GIB:
            said = kept + f"of CUDA graphs (floor {ACTIVATION_FLOOR_GIB:g} GiB + 0.5 GiB margin)"
        else:  # below the floor, but no less than what the server runs with today
            now = cap.activation_room_gib(cap.mem_fraction_static, ctx.hicache)
            said = (
                kept + f"of CUDA graphs, below kvpilot's {ACTIVATION_FLOOR_GIB:g} GiB floor but "
                f"no less than the server runs with now at {cap.mem_fraction_static:g} "
                f"({now:.2f} GiB): what it runs with is the evidence"
            )
        return Finding(reasons=(said, *prefill_graph_notes(ctx)))

    def usefulness(self, ctx: Change, value: Any, seen: Observed) -> Finding:
        if not moves_fraction(ctx):
            return NOTHING
        tokens, current = ctx.tokens, ctx.current
        refused = kit.capacity_grows(tokens, current, seen)
        if refused is not None:
            return refused
        m, exact = seen.m, ctx.cap.gpu.exact
        fit = ""
        if m.avg_prompt_tokens is not None:
            fitting = requests_fitting(ctx.server.info, m, tokens) or 0
            fit = f"; ~{fitting:.0f} requests of the observed size fit"
        reasons = [f"capacity {current:,} -> {tokens:,} tokens (+{tokens / current - 1:.0%}){fit}"]
        if not exact:
            reasons.append("GPU memory was estimated, so the prediction is approximate")
        return Finding(
            "recommended" if exact else "possible",
            tuple(reasons),
            (f"{m.running + m.queued:.0f} in-flight requests are dropped by the restart",),
        )


class KvDtypeCheck(Check):
    """kv_cache_dtype: a smaller element doubles the tokens, at some cost in answer quality."""

    names = ("kv_cache_dtype",)

    def shrinks(self, ctx: Change, value: Any) -> bool:
        return dtype_bytes(str(value)) < dtype_bytes(ctx.cap.kv_dtype)

    def safety(self, ctx: Change, value: Any) -> Finding:
        if not self.shrinks(ctx, value):
            return NOTHING
        return Finding(
            "needs_opt_in",
            (
                f"{value} halves the bytes per token: {ctx.current:,} -> {ctx.tokens:,} tokens",
                "FP8 KV costs accuracy: without calibrated scales SGLang uses 1.0, and "
                "hard reasoning evals drop a few points; only with an explicit opt-in",
            ),
            ("answer quality",),
        )

    def usefulness(self, ctx: Change, value: Any, seen: Observed) -> Finding:
        if not self.shrinks(ctx, value):
            already = (
                " (the checkpoint's `auto` is already FP8)"
                if ctx.cap.kv_dtype != str(ctx.server.info.arg("kv_cache_dtype") or "auto")
                else ""
            )
            return Finding("not_useful", (f"{value} does not shrink the KV cache{already}",))
        if binding_pool_of(seen.m) == "mamba":
            return Finding(
                "not_useful",
                (
                    "the mamba state pool binds, and the KV dtype does not touch it (its state "
                    "follows --mamba-ssm-dtype)",
                ),
            )
        if ctx.cap.geometry is None and ctx.cap.kv_dtype == "auto":
            return Finding(
                reasons=(
                    "the model's config.json could not be read, so kvpilot cannot rule out an "
                    "FP8 checkpoint whose `auto` KV is already FP8 (kv_cache_quant_algo); the "
                    "experiment measures the real gain",
                )
            )
        return NOTHING


class ConservativenessCheck(Check):
    """schedule_conservativeness: how much KV SGLang reserves for running requests' growth."""

    names = ("schedule_conservativeness",)
    predicts_gain = False

    def usefulness(self, ctx: Change, value: Any, seen: Observed) -> Finding:
        # compared as the scheduler uses them: under attention DP the flag is scaled by 0.3
        new = float(value) * conservativeness_scale(ctx.server.info)
        now = conservativeness(ctx.server.info)
        idle = self.changes_nothing(ctx, new, now, seen)
        if idle is not None:
            return Finding("not_useful", (idle,))
        rpm = retraction_rate(seen.m) or 0.0
        usage = seen.m.token_usage or 0.0
        if new > now and rpm > RETRACTIONS_PER_MIN_HIGH:
            return Finding(
                "possible",
                (
                    f"{rpm:.1f} retractions/min re-prefill work; admitting more cautiously "
                    f"({now:g} -> {new:g}) trades a little concurrency for fewer",
                ),
            )
        if new < now and seen.m.queued > 0 and usage < SATURATED_USAGE:
            return Finding(
                "possible",
                (
                    f"requests wait while usage is {usage:.2f}: admitting more eagerly "
                    f"({now:g} -> {new:g}) fills the pool",
                ),
            )
        return Finding(
            "not_useful", ("neither frequent retractions nor an under-used pool with a queue",)
        )

    def changes_nothing(self, ctx: Change, new: float, now: float, seen: Observed) -> str | None:
        """Why the new value cannot change admission, where it cannot: the initial ratio
        min(0.7 x value, 1.0) saturates (new_token_ratio_tracker.py), 0.5.23 reserves
        fixed-length requests in full whatever the ratio (schedule_policy.py
        `_get_running_request_total_token_offset`), and a grammar queue is not admission's."""
        if initial_ratio(new) == initial_ratio(now):
            return (
                f"{now:g} and {new:g} both start admission at new_token_ratio "
                f"{initial_ratio(now):.2f}: values above {CONSERVATIVENESS_SATURATION:.2f} "
                "change nothing"
            )
        if new < now and grammar_waiting(seen.m):
            return "requests wait for their grammar to compile, which admission does not decide"
        binding = reservation_binding(ctx.server.info, ctx.server.version, seen.m)
        if new < now and binding is not None and binding.fixed_length:
            return (
                "SGLang 0.5.23 reserves all that is left of fixed-length requests whatever "
                "new_token_ratio is, so a lower value admits no more of them"
            )
        return None


REQUEST_TABLE_BYTES = 4  # int32 per slot and context position (memory_pool.py ReqToTokenPool)
TABLE_WORTH_NAMING_GIB = 0.1


def request_table_growth(ctx: Change, per_rank: int) -> Finding:
    """A larger cap grows SGLang's request table: one row of the model's context length in
    int32 per request slot (`mem_cache/memory_pool.py` `ReqToTokenPool`), `max_running_requests`
    rows per rank where it is set, at most half the pool (`kv_cache_configurator.py`
    `resolve_max_num_reqs`). It is allocated after the KV pool, out of the room activations
    have: at a 128K context every 1,000 slots take 0.5 GiB."""
    info = ctx.server.info
    context, now = context_len(info), info.effective_max_running_requests
    if context is None or now is None:
        return NOTHING
    after = min(per_rank, ctx.per_scheduler // 2)
    growth_gib = max(0, after - now) * context * REQUEST_TABLE_BYTES / (1 << 30)
    if growth_gib < TABLE_WORTH_NAMING_GIB:
        return NOTHING
    room = ctx.cap.activation_room_gib(ctx.fraction, ctx.hicache) - growth_gib
    said = (
        f"SGLang's request table grows with the cap: {after - now:,} more slots a rank x "
        f"{context:,} positions x 4 bytes = {growth_gib:.2f} GiB of GPU memory outside the KV "
        f"pool, leaving {room:.2f} GiB for activations"
    )
    if room >= ACTIVATION_FLOOR_GIB:
        return Finding(reasons=(said,))
    return Finding(
        "possible",
        (f"{said}, below the {ACTIVATION_FLOOR_GIB:g} GiB floor kvpilot keeps for them",),
        ("GPU OOM at a peak: the request table takes activation headroom",),
    )


def cap_with_room(limit: int, seen: Observed) -> str:
    """The sentence for a batch held at its cap: how much of the pool it uses, and about how
    many requests the pool would hold (`pool_room`)."""
    said = f"the batch sits at the cap of {limit} while the pool has room"
    usage = seen.m.token_usage
    if not usage:
        return said
    fits = seen.m.running * pool_room(seen)
    return f"{said} ({usage:.0%} in use: about {fits:,.0f} requests would fit)"


class RunningCapCheck(Check):
    """max_running_requests: the batch's cap; it helps only where the batch sits at it."""

    names = ("max_running_requests",)
    predicts_gain = False

    def safety(self, ctx: Change, value: Any) -> Finding:
        per_rank = int(value) // ctx.ranks
        if ctx.ranks > 1 and per_rank < max(1, ctx.server.info.effective_max_running_requests or 1):
            return Finding(
                "unsafe",
                (
                    f"max_running_requests is global and SGLang divides it by the "
                    f"{ctx.ranks} attention-DP ranks: {value} leaves {per_rank} per rank, fewer "
                    f"than the {ctx.server.info.effective_max_running_requests} each runs now",
                ),
                ("a smaller batch on every rank",),
            )
        return request_table_growth(ctx, per_rank)

    def predicts_gain_for(self, change: Change) -> bool:
        """Beside a larger pool the gain is the pool's, bounded by the cap after the change; a
        lower cap may cut today's batch, and the loss is the batch's (`batch_shrink_loss`); a
        higher one lets it grow into the pool's room (`BatchLimits.room`)."""
        return change.tokens > change.current or self.moves(change) != 0

    @staticmethod
    def moves(change: Change) -> int:
        """-1, 0 or 1: the change sets a cap below, at or above today's (the flag, else
        SGLang's own for the pool)."""
        info = change.server.info
        user = info.arg("max_running_requests")
        today = int(user) if user is not None else running_cap_total(info)
        value = change.values.get("max_running_requests")
        if value is None or today is None or int(value) == today:
            return 0
        return -1 if int(value) < today else 1

    def usefulness(self, ctx: Change, value: Any, seen: Observed) -> Finding:
        limit = running_cap_total(ctx.server.info)
        after = min(cap.requests for cap in ctx.batch_caps)
        if after < seen.m.running:
            return Finding(
                "not_useful",
                (
                    f"a cap of {after:,} running requests is below the {seen.m.running:.0f} "
                    "running now: the batch shrinks to it, and the decode rate with it",
                ),
            )
        if seen.bottleneck == "compute" and limit and int(value) > limit:
            return Finding("possible", (cap_with_room(limit, seen),))
        if seen.kv_bound and ctx.tokens > ctx.current and after > seen.m.running:
            return Finding(reasons=(f"up to {after:,} requests may run in the larger pool",))
        return Finding("not_useful", ("the running-request cap does not limit this server now",))


class DpAttentionCheck(Check):
    """Attention data parallelism: each rank a scheduler with its own pool. With MLA the
    latent is held whole on every TP rank, so N ranks hold N pools; with GQA the heads are
    split over fewer ranks and the total does not grow."""

    names = ("attn_dp_size", "enable_dp_attention", "dp_size")
    predicts_gain = False

    def value(self, change: Change) -> Any:
        return change.ranks

    def safety(self, ctx: Change, value: Any) -> Finding:
        tp, ranks = ctx.server.info.tp_size, int(value)
        if ranks > 1 and tp % ranks:
            return Finding(
                "unsafe",
                (f"SGLang needs the TP size ({tp}) divisible by the attention-DP size ({ranks})",),
            )
        replicas = int(ctx.server.info.arg("dp_size") or 1)
        if ranks > 1 and replicas > 1 and not ctx.server.info.arg("enable_dp_attention"):
            return Finding(
                "unsafe",
                (
                    f"the server runs {replicas} data-parallel replicas (--dp-size), and SGLang "
                    "refuses replicas with attention DP (parallel_hook.py "
                    "`_handle_data_parallelism`)",
                ),
            )
        reserve = ctx.cap.reserve
        if reserve is None or ranks <= ctx.ranks_now:
            return NOTHING
        padding = dp_padding_gib(ctx, ranks)
        room = ctx.cap.activation_room_gib(ctx.fraction, ctx.hicache)
        if room - padding >= ACTIVATION_FLOOR_GIB:
            return Finding(reasons=(f"{room - padding:.2f} GiB stay for activations",))
        return Finding(
            "possible",
            (
                f"DP attention over {ranks} ranks pads CUDA graphs: SGLang's own default keeps "
                f"~{padding:.1f} GiB more outside the pool for it (3 MB x decode batch x ranks), "
                f"which would leave {room - padding:.2f} GiB of today's {room:.2f} GiB for "
                "activations; a lower mem_fraction_static or a smaller decode CUDA-graph batch "
                "restores it",
            ),
            (f"GPU OOM at a peak: ~{padding:.1f} GiB of graph padding SGLang budgets for",),
        )

    def usefulness(self, ctx: Change, value: Any, seen: Observed) -> Finding:
        if not (ctx.cap.mla and seen.kv_bound and int(value) > ctx.ranks_now):
            return Finding(
                "not_useful",
                ("more attention-DP ranks add KV capacity only to an MLA model that is KV-bound",),
            )
        return Finding(
            "possible",
            (
                f"MLA keeps the whole latent on every rank, so {value} ranks hold {value} pools: "
                f"{ctx.current:,} -> ~{ctx.tokens:,} tokens; attention weights are then "
                "replicated instead of split, so each pool is somewhat smaller than today's",
                "SGLang also divides the prefill chunk by the ranks and scales "
                "schedule_conservativeness by 0.3 under attention DP (parallel_hook.py)",
            ),
            (
                "smaller pools than predicted (attention weights replicated on every rank)",
                "admission more eager (conservativeness x 0.3)",
            ),
        )


class PrefillChunkCheck(Check):
    """chunked_prefill_size: larger chunks need activation memory in proportion to their size."""

    names = ("chunked_prefill_size",)
    predicts_gain = False

    def current(self, ctx: Change) -> int:
        """The flag's value: under attention DP SGLang reports the chunk divided by the ranks
        (parallel_hook.py::_handle_data_parallelism)."""
        reported = int(ctx.server.info.arg("chunked_prefill_size") or DEFAULT_CHUNK)
        return reported * ctx.ranks_now if reported > 0 else reported

    def safety(self, ctx: Change, value: Any) -> Finding:
        size, now = int(value), self.current(ctx)
        need = ACTIVATION_FLOOR_GIB * max(size, MIN_CHUNK) / max(now, MIN_CHUNK)
        room = ctx.cap.activation_room_gib(ctx.fraction, ctx.hicache, ctx.bytes_per_token)
        if size == -1 or (size > now and room < need):
            return Finding(
                "unsafe",
                (
                    f"larger prefill chunks need ~{need:.1f} GiB of activations; "
                    f"{room:.2f} GiB are left",
                ),
                ("GPU OOM in prefill",),
            )
        return NOTHING

    def frees_reserve(self, ctx: Change, value: Any) -> bool:
        """A smaller chunk that pays for a larger fraction: SGLang's reserve shrinks with it."""
        return int(value) < self.current(ctx) and moves_fraction(ctx)

    def predicts_gain_for(self, change: Change) -> bool:
        # the pool's growth is the gain; chunks of 2048 tokens or more keep prefill efficient
        return self.frees_reserve(change, self.value(change))

    def usefulness(self, ctx: Change, value: Any, seen: Observed) -> Finding:
        size, now = int(value), self.current(ctx)
        before, after = ctx.cap.reserve, ctx.cap.reserve_with(size)
        if self.frees_reserve(ctx, value) and before is not None and after is not None:
            return Finding(
                reasons=(
                    f"chunk {now} -> {size} lowers SGLang's own reserve from "
                    f"{before.total_gib:.2f} to {after.total_gib:.2f} GiB (1.5 MB per chunk "
                    "token for activations), which the larger pool takes",
                )
            )
        if seen.bottleneck == "prefill" and size > now:
            return Finding(
                "possible",
                ("prefill limits throughput and the activation headroom allows larger chunks",),
            )
        if size < now:
            return Finding(
                "possible" if seen.bottleneck in ("prefill", "kv_cache") else "not_useful",
                (
                    "smaller chunks interrupt decoding for less time and need less "
                    "activation memory, at a small prefill cost",
                ),
            )
        return Finding("not_useful", ("prefill does not limit this server",))


GRAPH_MIB_PER_SLOT = 2.0  # memory_hook.py reserve_for_graph_mb: decode max_bs * 2 MiB


class DecodeGraphCheck(Check):
    """cuda_graph_max_bs_decode: decode batches up to it replay captured CUDA graphs; larger
    ones run eagerly, slower per step. Capturing more takes GPU memory after the pool is
    allocated, from the room activations have."""

    names = ("cuda_graph_max_bs_decode",)
    predicts_gain = False

    def now(self, ctx: Change) -> int:
        gpu_mib = ctx.cap.gpu.total_mib or ctx.cap.gpu.pre_gib * 1024
        return decode_max_bs(ctx.server.info, gpu_mib)

    def extra_gib(self, ctx: Change, value: int) -> float:
        """More graph memory in proportion to the batch, from the server's own report where it
        has one, else SGLang's own 2 MiB-per-slot estimate."""
        now = self.now(ctx)
        if ctx.cap.graph_gib > 0 and now > 0:
            return ctx.cap.graph_gib * (value - now) / now
        return GRAPH_MIB_PER_SLOT * (value - now) / 1024

    def safety(self, ctx: Change, value: Any) -> Finding:
        extra = self.extra_gib(ctx, int(value))
        room = ctx.cap.activation_room_gib(ctx.fraction, ctx.hicache, ctx.bytes_per_token)
        if extra <= 0:
            return NOTHING
        if room - extra >= ACTIVATION_FLOOR_GIB:
            return self.dp_padding(ctx, int(value), room - extra)
        return Finding(
            "unsafe",
            (
                f"graphs up to a batch of {value} take ~{extra:.2f} GiB more, leaving "
                f"{room - extra:.2f} GiB for activations, below the {ACTIVATION_FLOOR_GIB:g} GiB "
                "SGLang needs",
            ),
            ("GPU OOM under load",),
        )

    def dp_padding(self, ctx: Change, value: int, room: float) -> Finding:
        """Under attention DP SGLang budgets 3 MB x batch x ranks of graph padding (more above
        a batch of 300); a larger batch that leaves less than that is only possible."""
        if ctx.ranks <= 1:
            return NOTHING
        gpu_mib = ctx.cap.gpu.total_mib or ctx.cap.gpu.pre_gib * 1024
        base = Deployment(gpu_mib=gpu_mib, attn_dp=ctx.ranks, prefill_graphs=False)
        now = sglang_reserve(replace(base, decode_max_bs=self.now(ctx))).graph_mib
        padding = (sglang_reserve(replace(base, decode_max_bs=value)).graph_mib - now) / 1024
        if room - padding >= ACTIVATION_FLOOR_GIB:
            return NOTHING
        return Finding(
            "possible",
            (
                f"with {ctx.ranks} attention-DP ranks SGLang budgets ~{padding:.1f} GiB more "
                f"graph padding for a batch of {value}, which would leave {room - padding:.2f} "
                "GiB for activations",
            ),
            (f"GPU OOM at a peak: ~{padding:.1f} GiB of graph padding SGLang budgets for",),
        )

    def usefulness(self, ctx: Change, value: Any, seen: Observed) -> Finding:
        per_rank = seen.m.running / ctx.ranks
        now = self.now(ctx)
        if int(value) > now and per_rank > now:
            return Finding(
                "possible",
                (
                    f"~{per_rank:.0f} requests decode per rank, above the {now} the CUDA graphs "
                    f"cover, so those steps run eagerly; graphs up to {value} cover them",
                ),
            )
        return Finding(
            "not_useful",
            (f"the decode batch (~{per_rank:.0f} per rank) fits the graphs up to {now}",),
        )


LPM_QUEUE_LIMIT = 128  # managers/schedule_policy.py WAITING_QUEUE_PREFIX_MATCH_MAX
PREFIX_SHARE = 0.2  # prompt tokens served from the cache beyond which prefixes are shared


def prefix_heavy(m: Measurement) -> bool:
    """Prompts that dominate the work and share prefixes: what the order of admission helps."""
    prompt, output = m.avg_prompt_tokens, m.avg_output_tokens
    heavy = prompt is not None and output is not None and prompt >= PROMPT_HEAVY * output
    return heavy and (m.cached_fraction or 0.0) >= PREFIX_SHARE


class SchedulePolicyCheck(Check):
    """schedule_policy: `lpm` admits the waiting requests that share the longest cached
    prefix first, so shared prefixes stay in the pool; it costs fairness, not memory."""

    names = ("schedule_policy",)
    predicts_gain = False

    def safety(self, ctx: Change, value: Any) -> Finding:
        if value == "lpm" and ctx.server.info.arg("disable_radix_cache"):
            return Finding(
                "not_useful",
                ("without the radix cache SGLang falls back to fcfs (schedule_policy.py)",),
            )
        return NOTHING

    def usefulness(self, ctx: Change, value: Any, seen: Observed) -> Finding:
        m = seen.m
        shared = m.cached_fraction or 0.0
        if value != "lpm":
            return Finding("not_useful", ("fcfs admits in arrival order; it shares nothing more",))
        if m.queued > LPM_QUEUE_LIMIT:
            return Finding(
                "not_useful",
                (
                    f"{m.queued:.0f} requests wait on average: above {LPM_QUEUE_LIMIT} SGLang "
                    "turns prefix matching off and admits first come, first served "
                    "(schedule_policy.py `_determine_active_policy`)",
                ),
            )
        if not prefix_heavy(m) or seen.bottleneck not in ("kv_cache", "prefill"):
            return Finding(
                "not_useful",
                (
                    f"{shared:.0%} of prompt tokens came from the cache, prompts of "
                    f"{m.avg_prompt_tokens or 0:,.0f} tokens for {m.avg_output_tokens or 0:,.0f} "
                    "of output: not the prefix-heavy work an admission order helps",
                ),
            )
        return Finding(
            "possible",
            (
                f"{shared:.0%} of prompt tokens came from the cache and {m.queued:.0f} requests "
                "wait: admitting those with the longest cached prefix first keeps shared "
                "prefixes in the pool (fairness: a request with a new prefix may wait longer)",
            ),
            ("requests with uncommon prefixes wait longer",),
        )


class RideAlongCheck(Check):
    """An argument that does not raise KV capacity: it decides a verdict only on its own."""

    fallback = True

    def __init__(self, name: str) -> None:
        self.names = (name,)

    def usefulness(self, ctx: Change, value: Any, seen: Observed) -> Finding:
        return Finding("not_useful", (f"{self.names[0]} does not raise KV capacity",))


# Argument name -> its check, in the order their reasons are listed.
CHECKS: dict[str, kit.Check[Change]] = kit.table(
    (
        StaticPoolCheck(),
        KvDtypeCheck(),
        HostPoolCheck(),
        ConservativenessCheck(),
        RunningCapCheck(),
        DpAttentionCheck(),
        SchedulePolicyCheck(),
        DecodeGraphCheck(),
        PrefillChunkCheck(),
        RideAlongCheck("max_total_tokens"),
        RideAlongCheck("page_size"),
        RideAlongCheck("max_prefill_tokens"),
        RideAlongCheck("hicache_write_policy"),
    )
)


def checks_for(change: Change) -> list[kit.Check[Change]]:
    """The checks a change calls on, each once, in table order; unknown arguments last."""
    return kit.checks_for(CHECKS, change)
