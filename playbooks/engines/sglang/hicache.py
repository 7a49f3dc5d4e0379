"""SGLang's hierarchical cache: whether its host pool fits, what enabling it changes, helps.

The hierarchical cache: does every rank's pinned pool fit in host RAM, what else enabling it
changes on this SGLang version, which combinations SGLang refuses, and does a host tier help.

SGLang sizes the pool per rank (`hicache_size` GB, or `hicache_ratio` times the GPU pool), and
every rank on the host builds its own, so the host must hold ranks x size. Since 0.5.19 SGLang
splits its budget per rank itself and refuses to start (`mem_cache/pool_host/base.py`,
`host_memory_budget_bytes`, `ranks_per_host`); older versions check each rank against the whole
host, start, pin the memory and are killed by the OOM killer under load. Since 0.5.21 that budget
is also bounded by the container's memory cgroup (`mem_cache/host_memory.py`); before, a pool
that fits the host but not the container starts and is killed by the container's limit.

Why it is long: SGLang's host tier has many refusals of its own (versions, layouts, backends,
DSA and draft pools, the per-rank race), each a cited rule; they are judged together because
they size one pool.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from playbooks.engines.kit.checks import Observed
from playbooks.engines.sglang.capacity import GIB, HOST_RESERVE_GIB, HostBudget
from playbooks.engines.sglang.facts import Server
from playbooks.engines.sglang.host_tier import tier_usefulness
from playbooks.engines.sglang.proposed_change import (
    SWA_OFF_WITH_HICACHE,
    Change,
    Check,
    Finding,
    model_words,
)

DEFAULT_RATIO = 2.0  # SGLang's hicache_ratio when neither size nor ratio is given
# 0.5.21 on: with neither size nor ratio given, SGLang lowers the default ratio until the host
# pools of all ranks fit this share of the host's free memory after its 10 GiB reserve, less 5%
# slack (mem_cache/hicache_auto_size.py `auto_size_hicache`, `_ALLOCATION_SLACK_FRACTION`;
# --hicache-host-memory-fraction, arg_groups/fields/memory.py; read in 0.5.21-0.5.23)
AUTO_SIZE_SINCE = (0, 5, 21)
AUTO_HOST_FRACTION = 0.8
AUTO_SLACK = 0.05
PAGE_SIZE_ADVISED = 64  # docs/advanced_features/hicache_best_practices.md: "--page-size 64"
# Every scheduler step polls the host transfers (managers/scheduler.py
# _process_hicache_events -> tree_cache.check_hicache_events, a TP-wide consensus).
DECODE_OVERHEAD = "per-step decode overhead (the scheduler polls host transfers every step)"


# ------------------------------------------------------------------ what enabling HiCache does
# Each entry was read in the released wheels (0.5.5.post3 to 0.5.23); `since` and `until` are the
# first version with it and the first without it. Settings are SGLang's server-arg names after the
# change, as `server_info` reports them (resolved values, so a backend left to auto shows what it
# resolved to).
Version = tuple[int, int, int]
Settings = Mapping[str, Any]
EVERY = ((0, 0, 0), None)


@dataclass(frozen=True)
class Rule:
    """One thing SGLang does when HiCache is on: refuse to start (`fix` says how to fix it) or
    change something else (`effect` says what it costs)."""

    since: Version
    until: Version | None
    when: Callable[[Settings], bool]
    says: str  # SGLang's own words (its error, or its warning)
    remedy: str  # the fix (refusal) or what it costs (side effect)
    source: str  # SGLang file and function
    risk: str = "the server does not start"  # the short label an option lists

    def holds(self, version: Version, settings: Settings) -> bool:
        in_range = self.since <= version and (self.until is None or version < self.until)
        return in_range and self.when(settings)


def _on(name: str) -> Callable[[Settings], bool]:
    return lambda s: bool(s.get(name))


def _trtllm_mha(s: Settings) -> bool:
    backends = (s.get("attention_backend"), s.get("prefill_attention_backend"))
    return "trtllm_mha" in (*backends, s.get("decode_attention_backend"))


def _speculative_with_dcp(s: Settings) -> bool:
    return int(s.get("dcp_size") or 1) > 1 and s.get("speculative_algorithm") not in (
        None,
        "DSPARK",
    )


def _kernel_io(s: Settings) -> bool:
    return bool(s.get("hicache_io_backend", "kernel") == "kernel")


def _decode_backend(s: Settings) -> Any:
    return s.get("decode_attention_backend") or s.get("attention_backend")


def _model_is(*names: str) -> Callable[[Settings], bool]:
    def matches(s: Settings) -> bool:
        model = model_words(s.get("model_path"))
        return any(name in model for name in names)

    return matches


# Combinations SGLang refuses at start-up: refused here before a restart, in SGLang's words.
REFUSALS = (
    Rule(
        *EVERY,
        _on("disable_radix_cache"),
        "The arguments enable-hierarchical-cache and disable-radix-cache are mutually exclusive "
        "and cannot be used at the same time.",
        "drop disable_radix_cache: HiCache extends the radix cache to host memory",
        "server_args.py ServerArgs._handle_cache_compatibility (0.5.5, 0.5.10); "
        "arg_groups/kv_cache_hook.py (0.5.23)",
    ),
    Rule(
        (0, 5, 21),
        None,
        _on("enable_lmcache"),
        "--enable-lmcache and --enable-hierarchical-cache are mutually exclusive",
        "keep one of them: drop enable_lmcache, or leave HiCache off",
        "arg_groups/kv_cache_hook.py, the LMCache checks",
    ),
    Rule(
        (0, 5, 23),
        None,
        lambda s: s.get("kv_cache_dtype") == "nvfp4" and _trtllm_mha(s),
        "SM100 native NVFP4 with trtllm_mha does not yet support hierarchical KV cache or "
        "LMCache because their host pools do not preserve the physical block-scale layout.",
        "keep NVFP4 KV on trtllm_mha without HiCache, or use an fp8 KV cache with HiCache",
        "arg_groups/kv_cache_hook.py, the KV4 checks (uses_sm100_trtllm_nvfp4; trtllm_mha runs "
        "only on SM100, so the platform condition holds wherever it runs)",
    ),
    Rule(
        (0, 5, 23),
        None,
        lambda s: int(s.get("dcp_size") or 1) > 1 and s.get("attention_backend") == "dsa",
        "DSA DCP does not support HiSparse or HiCache.",
        "set dcp_size 1 to use HiCache on a DSA model (DeepSeek V3.2, GLM 5)",
        "arg_groups/model_overrides/deepseek_v2.py _dsa_dcp_overrides",
    ),
    Rule(
        (0, 5, 18),
        None,
        _speculative_with_dcp,
        "HiCache with --dcp-size > 1 only supports DSPARK speculative decoding; other "
        "draft-model host pools have no DCP index translation.",
        "set dcp_size 1, or speculate with DSPARK, or leave HiCache off",
        "arg_groups/hicache_hook.py resolve_hicache_dcp_compatibility",
    ),
    Rule(
        (0, 5, 14),
        None,
        _on("enable_int8_mamba_checkpoint"),
        "--enable-int8-mamba-checkpoint is not supported together with "
        "--enable-hierarchical-cache: the host-offload path is not int8-aware.",
        "drop enable_int8_mamba_checkpoint, or leave HiCache off",
        "server_args.py _handle_int8_mamba_checkpoint (0.5.14); "
        "arg_groups/mamba_hook.py handle_int8_mamba_checkpoint (0.5.23)",
    ),
    Rule(
        (0, 5, 20),
        None,
        _on("enable_unified_cache_external_linker"),
        "--enable-unified-cache-external-linker and --enable-hierarchical-cache are mutually "
        "exclusive.",
        "keep one of them",
        "arg_groups/hicache_hook.py handle_hicache",
    ),
    Rule(
        (0, 5, 19),
        None,
        lambda s: (
            s.get("hicache_host_memory_mode") == "buffer_only"
            and not s.get("hicache_storage_backend")
        ),
        "--hicache-host-memory-mode buffer_only requires a storage backend "
        "(--hicache-storage-backend)",
        "set hicache_storage_backend, or use hicache_host_memory_mode cache",
        "arg_groups/hicache_hook.py validate_hicache_host_memory_mode",
    ),
)

# What else changes when HiCache is on: risks of the change, with what they cost.
DECODE_BACKEND_COST = (
    "decode runs on another attention backend (or slower direct host I/O): decode speed "
    "measured before does not carry over"
)
SWA_OFF_COST = (
    "the sliding-window layers keep full-length KV: the KV pool holds fewer tokens than "
    "max_total_num_tokens shows now"
)
SIDE_EFFECTS = (
    Rule(
        (0, 0, 0),
        (0, 5, 10),
        _kernel_io,
        "SGLang picks the decode attention backend itself (flashinfer or triton) because "
        "FlashAttention3 decoding is not compatible with the HiCache kernel I/O backend; an "
        "explicit fa3 decode backend switches hicache_io_backend to direct instead",
        DECODE_BACKEND_COST,
        "server_args.py ServerArgs._handle_hicache (0.5.5)",
        risk="decode attention backend changes",
    ),
    Rule(
        (0, 5, 10),
        (0, 5, 14),
        lambda s: _kernel_io(s) and _decode_backend(s) == "fa3",
        "FlashAttention3 decode backend is not compatible with hierarchical cache: SGLang "
        "switches decode to flashinfer or triton, or (fa3 set explicitly) hicache_io_backend "
        "to direct",
        DECODE_BACKEND_COST,
        "server_args.py ServerArgs._resolve_io_decode_attention_compatibility",
        risk="decode attention backend changes",
    ),
    Rule(
        (0, 5, 10),
        (0, 5, 19),
        lambda s: not s.get("disable_piecewise_cuda_graph"),
        "SGLang disables piecewise CUDA graphs with HiCache (host offload breaks dynamo)",
        "prefill runs without piecewise CUDA graphs: slower prefill and time to first token",
        "server_args.py ServerArgs._handle_piecewise_cuda_graph",
        risk="no piecewise CUDA graphs",
    ),
    Rule(
        (0, 5, 10),
        None,
        _model_is(*SWA_OFF_WITH_HICACHE[0][0]),
        "Disable hybrid SWA memory for Step3p5ForCausalLM model with hierarchical cache "
        "(swa_full_tokens_ratio reset to 1.0)",
        SWA_OFF_COST,
        "server_args.py _handle_model_specific_adjustments (0.5.10); "
        "arg_groups/overrides.py (0.5.23)",
        risk="fewer KV tokens (hybrid SWA pool off)",
    ),
    Rule(
        (0, 5, 10),
        (0, 5, 21),
        _model_is(*SWA_OFF_WITH_HICACHE[1][0]),
        "Disable hybrid SWA memory for MiMoV2FlashForCausalLM model with hierarchical cache "
        "(swa_full_tokens_ratio reset to 1.0)",
        SWA_OFF_COST,
        "server_args.py _handle_model_specific_adjustments",
        risk="fewer KV tokens (hybrid SWA pool off)",
    ),
    Rule(
        *EVERY,
        lambda s: int(s.get("page_size") or 1) < PAGE_SIZE_ADVISED,
        f"SGLang's HiCache guide runs it with --page-size {PAGE_SIZE_ADVISED}",
        f"small pages make many small host transfers; set page_size {PAGE_SIZE_ADVISED} with it",
        "docs/advanced_features/hicache_best_practices.md",
        risk="small pages",
    ),
)


def refusals(version: Version, settings: Settings) -> list[Rule]:
    """The combinations this SGLang version refuses to start with."""
    return [rule for rule in REFUSALS if rule.holds(version, settings)]


def side_effects(version: Version, settings: Settings) -> list[Rule]:
    """What else enabling HiCache changes on this SGLang version."""
    return [rule for rule in SIDE_EFFECTS if rule.holds(version, settings)]


def refusal_finding(version_text: str, refused: list[Rule]) -> Finding:
    """SGLang's own reasons, ArgError style: what it says, then how to fix it."""
    reasons = tuple(
        f"SGLang {version_text} refuses to start: {r.says} Fix: {r.remedy} ({r.source})"
        for r in refused
    )
    return Finding("unsafe", reasons, ("the server does not start",))


# ------------------------------------------------------------------ the host pool
def host_arithmetic(ctx: Change, per_rank_gb: float, budget: HostBudget) -> str:
    ranks = ctx.server.ranks_on_host
    usable_gb = budget.per_rank_budget_gib * ranks * GIB / 1e9
    where = "the container may use" if _container_limited(ctx.server) else "the host has"
    indexer_gb = host_pool_tokens(ctx) * indexer_bytes(ctx) / 1e9
    split = (
        f" ({per_rank_gb - indexer_gb:.1f} GB of KV and {indexer_gb:.1f} GB of DSA indexer keys, "
        "a host pool SGLang sizes outside --hicache-size)"
        if indexer_gb
        else ""
    )
    return (
        f"{ranks} ranks x {per_rank_gb:.1f} GB{split} = {per_rank_gb * ranks:.0f} GB of pinned "
        f"host RAM (every rank builds its own pool); {where} {budget.host_total_gib:.0f} GiB, "
        f"{budget.host_available_gib:.0f} GiB available, {usable_gb:.0f} GB usable after "
        "SGLang's 10 GiB reserve and a 10% margin"
    )


def _container_limited(server: Server) -> bool:
    return server.host is not None and server.host.container_limited


def over_budget_outcome(server: Server) -> str:
    """What SGLang does with a pool the host (or its container) cannot hold."""
    if _container_limited(server) and not server.container_limit_checked:
        return (
            f"SGLang {server.info.version} checks the host's free memory, not the container's "
            "limit (that arrives in 0.5.21), so it starts, pins the memory and the container's "
            "memory limit kills it under load"
        )
    if server.per_rank_checked:
        return "SGLang refuses to start (it splits the host budget per rank)"
    return (
        "SGLang checks each rank against the whole host, so it starts, pins "
        "the memory and is killed by the host's OOM killer under load"
    )


def auto_fraction(ctx: Change) -> float | None:
    """The host share SGLang sizes the pool to when the change leaves it to SGLang (0.5.21 on,
    neither `--hicache-ratio` nor `--hicache-size` set, here or on the running server, which
    reports the fraction as None when they were); None where the ratio is taken as given."""
    if ctx.server.version < AUTO_SIZE_SINCE:
        return None
    info = ctx.server.info
    if ctx.values.get("hicache_ratio") is not None or float(ctx.values.get("hicache_size") or 0):
        return None
    if "hicache_size" not in ctx.values and float(info.arg("hicache_size") or 0) > 0:
        return None
    args = info.server_args
    if "hicache_host_memory_fraction" in args and args["hicache_host_memory_fraction"] is None:
        return None  # the running server's ratio was given: the change keeps it
    given = ctx.values.get("hicache_host_memory_fraction", args.get("hicache_host_memory_fraction"))
    return AUTO_HOST_FRACTION if given is None else float(given)


def auto_ratio(ctx: Change, fraction: float) -> float | None:
    """The ratio SGLang resolves to (`auto_size_hicache`): the default, lowered until every
    rank's pool fits its share of the host; None where host RAM is not known here."""
    host = ctx.server.host
    if host is None:
        return None
    budget_gib = (host.available_gib - HOST_RESERVE_GIB) / max(1, ctx.server.ranks_on_host)
    device_gib = ctx.per_scheduler * ctx.bytes_per_token / GIB
    requested = float(ctx.values.get("hicache_ratio") or DEFAULT_RATIO)
    return min(requested, budget_gib * fraction * (1 - AUTO_SLACK) / device_gib)


def ratio_after(ctx: Change) -> float:
    """The host-to-device ratio the change runs with: given, auto-sized, or the default."""
    fraction = auto_fraction(ctx)
    if fraction is not None:
        ratio = auto_ratio(ctx, fraction)
        if ratio is not None:
            return max(0.0, ratio)
    given = ctx.values.get("hicache_ratio") or ctx.server.info.arg("hicache_ratio")
    return float(given or DEFAULT_RATIO)


def indexer_bytes(ctx: Change) -> int:
    """A DSA model's indexer keys per token, which its HiCache keeps in a host pool of its own
    beside the KV one (`pool_host/dsa.py`, `DSAIndexerPoolHost`: as many tokens as the KV host
    pool, outside `--hicache-size`, checked against free host memory after the KV pool)."""
    geometry = ctx.cap.geometry
    return geometry.indexer_bytes if geometry is not None else 0


def host_kv_bytes(ctx: Change) -> float:
    """Bytes per token of the KV host pool `--hicache-size` sizes (the indexer's apart)."""
    return ctx.bytes_per_token - indexer_bytes(ctx)


def host_pool_tokens(ctx: Change) -> int:
    """One rank's host pool in tokens, as SGLang sizes it (`mem_cache/pool_host/base.py`
    `HostKVCache.__init__`): `hicache_size` GB (decimal) over the bytes per token, else the GPU
    pool times the ratio (auto-sized where SGLang sizes it), then one page more than whole
    pages."""
    size_gb = float(ctx.values.get("hicache_size") or ctx.server.info.arg("hicache_size") or 0)
    per_rank = ctx.per_scheduler
    if size_gb > 0:
        tokens = int(size_gb * 1e9 // host_kv_bytes(ctx))
    else:
        tokens = int(per_rank * ratio_after(ctx))
    page = ctx.cap.page_size
    return (tokens // page + 1) * page


def pool_safety(ctx: Change, per_rank_gb: float) -> Finding:
    """Whether all ranks' pools fit, judged by what this SGLang version checks itself; a DSA
    model's indexer pool counted beside the KV pool `per_rank_gb` names."""
    server, ranks = ctx.server, ctx.server.ranks_on_host
    per_rank_gb += host_pool_tokens(ctx) * indexer_bytes(ctx) / 1e9
    if server.host is None:
        return Finding(
            "unsafe",
            (
                f"{ranks} ranks x {per_rank_gb:.1f} GB = {per_rank_gb * ranks:.0f} GB of "
                "pinned host RAM, and host RAM is unknown (configure host_ram_gib): "
                "cannot be checked",
            ),
            ("host OOM",),
        )
    budget = HostBudget.of(server.host.total_gib, server.host.available_gib, ranks)
    arithmetic = host_arithmetic(ctx, per_rank_gb, budget)
    fraction = auto_fraction(ctx)
    if fraction is not None:
        return auto_sized_safety(ctx, fraction, arithmetic)
    if per_rank_gb * ranks > budget.per_rank_budget_gib * ranks * GIB / 1e9:
        return Finding("unsafe", (arithmetic, over_budget_outcome(server)), ("host OOM",))
    raced = race_finding(server, per_rank_gb, arithmetic)
    if raced is not None:
        return raced
    host_tokens = host_pool_tokens(ctx)
    if host_tokens > ctx.per_scheduler:
        return Finding(reasons=(arithmetic + ": fits",))
    sizes = f"the host pool ({host_tokens:,} tokens) and the GPU pool ({ctx.per_scheduler:,})"
    if not server.host_pool_may_be_smaller:
        # mem_cache/memory_pool_host.py HostKVCache.__init__ asserts it up to 0.5.14
        return Finding(
            "unsafe",
            (
                f"the host pool ({host_tokens:,} tokens) must be larger than the GPU pool "
                f"({ctx.per_scheduler:,}): SGLang {server.info.version} refuses to start",
            ),
        )
    # mem_cache/pool_host/base.py HostKVCache.__init__ only warns from 0.5.15
    return Finding(
        reasons=(
            arithmetic + ": fits",
            f"{sizes}: a host pool no larger than the GPU pool keeps little the GPU does not "
            "(SGLang only warns)",
        ),
        risks=("a host pool no larger than the GPU pool",),
    )


def race_limit_gb(server: Server) -> float | None:
    """The largest explicit pool a rank that starts last still accepts, from the release that
    splits the host per rank (0.5.19): each rank reads the memory free after the ranks before
    it pinned theirs, and divides by all of them (pool_host/base.py `host_memory_budget_bytes`;
    sglang#38156), so the last of r sees F - (r-1) x S: S <= (F - 10 GiB) / (2r - 1)."""
    ranks = server.ranks_on_host
    if server.host is None or not server.per_rank_checked or ranks <= 1:
        return None
    free = max(0.0, server.host.available_gib - HOST_RESERVE_GIB)
    return free / (2 * ranks - 1) * GIB / 1e9


def race_finding(server: Server, per_rank_gb: float, arithmetic: str) -> Finding | None:
    limit = race_limit_gb(server)
    if limit is None or per_rank_gb <= limit:
        return None
    return Finding(
        "possible",
        (
            arithmetic + ": fits the split",
            f"but SGLang {server.info.version} checks each rank against the host memory free "
            f"when that rank starts, after the ranks before it pinned theirs, divided by all "
            f"{server.ranks_on_host} (pool_host/base.py `host_memory_budget_bytes`, sglang#38156): "
            f"above {limit:.1f} GB a rank the last ranks can be refused, so starts fail "
            "intermittently",
        ),
        ("the start may fail intermittently and be reverted",),
    )


def auto_sized_safety(ctx: Change, fraction: float, arithmetic: str) -> Finding:
    """SGLang sizes the pool to fit the host: safe by construction, unless nothing is left."""
    ratio = auto_ratio(ctx, fraction)
    version = ctx.server.info.version
    if ratio is None or ratio <= 0:
        return Finding(
            "unsafe",
            (
                f"SGLang {version} sizes the host pool to {fraction:g} of the host's free "
                f"memory after its {HOST_RESERVE_GIB:g} GiB reserve, and refuses to start "
                'where that leaves nothing: "No host memory is left for HiCache after the 10 GiB '
                'reserve" (mem_cache/hicache_auto_size.py)',
            ),
            ("the restart fails to start and is reverted",),
        )
    requested = float(ctx.values.get("hicache_ratio") or DEFAULT_RATIO)
    lowered = f"ratio {requested:g} -> {ratio:.2f}" if ratio < requested else f"ratio {ratio:g}"
    said = (
        f"SGLang {version} sizes the host pool to fit when neither --hicache-ratio nor "
        f"--hicache-size is given: {lowered} ({fraction:g} of the host's free memory after a "
        f"{HOST_RESERVE_GIB:g} GiB reserve, over {ctx.server.ranks_on_host} ranks; "
        "mem_cache/hicache_auto_size.py), "
        f"{host_pool_tokens(ctx):,} tokens a rank"
    )
    risks: tuple[str, ...] = ()
    if ratio <= 1:
        said += ": a host pool no larger than the GPU pool keeps little the GPU does not"
        risks = ("a host pool no larger than the GPU pool",)
    return Finding(reasons=(said,), risks=risks)


class HostPoolCheck(Check):
    """enable_hierarchical_cache, hicache_size, hicache_ratio: the host pool, judged as one.

    The value judged is the pool's size per rank in GB, from the size or else the ratio.
    """

    names = ("enable_hierarchical_cache", "hicache_size", "hicache_ratio")
    predicts_gain = False  # a host tier saves recomputation; the KV capacity model cannot say

    def applies(self, change: Change) -> bool:
        return change.hicache and super().applies(change)

    def value(self, change: Change) -> float:
        size_gb = float(change.values.get("hicache_size") or 0)
        if size_gb > 0:
            return size_gb
        # each rank sizes its pool from its own GPU pool (pool_host/base.py)
        return ratio_after(change) * change.per_scheduler * host_kv_bytes(change) / 1e9

    def safety(self, ctx: Change, value: Any) -> Finding:
        """Refused combinations first (in SGLang's words), then the pool, then side effects."""
        server = ctx.server
        settings = {**server.info.server_args, **ctx.values}
        refused = refusals(server.version, settings)
        if refused:
            return refusal_finding(server.info.version, refused)
        pool = pool_safety(ctx, float(value))
        if server.hicache_on or pool.verdict == "unsafe":
            return pool  # already on, its side effects are in what was measured
        effects = side_effects(server.version, settings)
        return Finding(
            pool.verdict,
            pool.reasons + tuple(f"{e.says}: {e.remedy} ({e.source})" for e in effects),
            pool.risks + tuple(dict.fromkeys(e.risk for e in effects)) + (DECODE_OVERHEAD,),
        )

    def usefulness(self, ctx: Change, value: Any, seen: Observed) -> Finding:
        return tier_usefulness(seen, ctx.per_scheduler, host_pool_tokens(ctx))
