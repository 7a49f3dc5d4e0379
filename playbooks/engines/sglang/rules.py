"""SGLang's rules: what a bottleneck looks like on an SGLang server, and which changes help.

Pure functions over typed facts (server info, a measurement, the capacity model, host memory):
`analyse()` names the bottleneck with numbers, `propose()` lists the changes that address it with
predicted capacity, predicted throughput, risk and a verdict. `evaluate()` judges one change, so
`--consider KEY=VALUE` runs exactly the same checks as the bot's own proposals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from playbooks.diagnose.measure import Measurement
from playbooks.engines.base import Assessment
from playbooks.engines.sglang.capacity import (
    ACTIVATION_FLOOR_GIB,
    GIB,
    KV_DTYPE_BYTES,
    CapacityModel,
    GpuMemory,
    HostBudget,
    build_model,
)
from playbooks.engines.sglang.client import ServerInfo
from playbooks.sources.gpu import GpuUnavailable
from playbooks.sources.host import HostMemory, HostUnavailable
from playbooks.types import VERDICT_ORDER, Bottleneck, Option, Verdict

if TYPE_CHECKING:
    from playbooks.diagnose.playbook import DiagnoseSettings

SATURATED_USAGE = 0.85  # token usage above this with a queue: the KV pool is the limit
CUDA_CONTEXT_GIB = 0.5  # what the CUDA context takes before SGLang measures free memory
RETRACTIONS_PER_MIN_HIGH = 1.0  # SGLang's guide: about one retraction a minute is acceptable


@dataclass(frozen=True)
class Context:
    """Everything the pure decision functions need."""

    info: ServerInfo
    m: Measurement
    cap: CapacityModel
    host: HostMemory | None
    ranks_on_host: int
    version: tuple[int, int, int]

    @property
    def hicache_on(self) -> bool:
        return bool(self.info.arg("enable_hierarchical_cache"))

    @property
    def per_rank_checked(self) -> bool:
        """SGLang 0.5.23 splits the host budget per rank; older versions do not."""
        return self.version >= (0, 5, 23)


def parse_version(text: str) -> tuple[int, int, int]:
    parts = []
    for piece in text.lstrip("v").split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    while len(parts) < 3:
        parts.append(0)
    return (parts[0], parts[1], parts[2])


# ----------------------------------------------------------------------------- gathering
def resolve_gpu_memory(
    info: ServerInfo, settings: DiagnoseSettings
) -> tuple[GpuMemory | None, list[str]]:
    notes: list[str] = []
    if settings.gpu_memory_gib is not None:
        return GpuMemory(settings.gpu_memory_gib, "configuration", True), notes
    sa = info.memory.startup_available_gb
    fraction = info.mem_fraction_static
    if sa is not None and fraction is not None and fraction < 1:
        graph = info.memory.graph_gb or 0.0
        if info.arg("max_total_tokens") is None:
            # Uncapped, the pool takes f * pre - static, so what is left after start-up is
            # exactly (1 - f) * pre - graphs.
            source = "server: (startup_available + graphs) / (1 - mem_fraction_static)"
            return GpuMemory((sa + graph) / (1 - fraction), source, True), notes
        known = sa + graph + (info.memory.weight_gb or 0.0) + (info.memory.kvcache_gb or 0.0)
        notes.append(
            "the KV pool is capped by --max-total-tokens, so GPU memory is taken as "
            "startup_available + weights + KV + graphs, which misses the CUDA context"
        )
        return GpuMemory(known, "server: startup_available + weights + KV + graphs", False), notes
    if settings.gpus is not None:
        try:
            gpus = settings.gpus.snapshot()
            total = min(g.memory_total_gib for g in gpus)
            return GpuMemory(
                total - CUDA_CONTEXT_GIB,
                f"NVML: {gpus[0].name}, {gpus[0].memory_total_mib} MiB, less "
                f"{CUDA_CONTEXT_GIB} GiB for the CUDA context",
                True,
            ), notes
        except GpuUnavailable as exc:
            notes.append(f"GPU probe unavailable ({exc}); GPU memory estimated")
    notes.append(
        "GPU memory is not known (no configuration, no NVML, SGLang < 0.5.23): it is "
        "estimated from the server's own split, so capacity predictions for a new "
        "mem_fraction_static are approximate. Set gpu_memory_gib for exact ones."
    )
    return None, notes


def capacity_model(info: ServerInfo, fraction: float, gpu: GpuMemory | None) -> CapacityModel:
    """The capacity arithmetic fed from the server's own report."""
    return build_model(
        mem_fraction_static=fraction,
        max_total_num_tokens=info.max_total_num_tokens,
        kvcache_gb=info.memory.kvcache_gb,
        token_capacity=info.memory.token_capacity,
        weights_gb=info.memory.weight_gb,
        graph_gb=info.memory.graph_gb,
        gpu=gpu,
        page_size=int(info.arg("page_size") or 1),
        max_total_tokens_cap=info.arg("max_total_tokens"),
        kv_dtype=str(info.arg("kv_cache_dtype") or "auto"),
    )


def ranks_on_host(info: ServerInfo) -> int:
    tp = int(info.arg("tp_size") or 1)
    pp = int(info.arg("pp_size") or 1)
    dp = 1 if info.arg("enable_dp_attention") else int(info.arg("dp_size") or 1)
    nodes = int(info.arg("nnodes") or 1)
    return max(1, tp * pp * dp // nodes)


@dataclass
class ServerRules:
    """The rules for one server, its capacity model and host read before anything is measured.

    Built first so a server kvpilot cannot reason about fails before a measurement window is
    spent on it; `assess` then judges a measurement, `judge` one change without one.
    """

    info: ServerInfo
    cap: CapacityModel
    host: HostMemory | None
    settings: DiagnoseSettings
    notes: list[str]

    def context(self, m: Measurement) -> Context:
        info = self.info
        return Context(
            info, m, self.cap, self.host, ranks_on_host(info), parse_version(info.version)
        )

    def assess(self, m: Measurement) -> Assessment:
        """The bottleneck, the changes that address it, and the capacity facts behind them."""
        ctx = self.context(m)
        bottleneck, evidence = analyse(ctx)
        consider = self.settings.consider
        asked = [evaluate(change, ctx, bottleneck, considered=True) for change in consider]
        options = [o for o in propose(ctx, bottleneck) if o.change not in consider] + asked
        return Assessment(
            bottleneck=bottleneck,
            evidence=evidence,
            options=sorted(options, key=lambda o: (o.considered, -VERDICT_ORDER[o.verdict])),
            bytes_per_token=self.cap.bytes_per_token,
            gpu_memory_gib=self.cap.gpu.pre_gib,
            gpu_memory_source=self.cap.gpu.source,
            requests_that_fit=requests_that_fit(ctx),
            notes=list(self.notes),
        )

    def judge(self, change: dict[str, Any]) -> Option:
        """Safety verdict for one change without a measurement window (for experiments).

        The same capacity and host checks as `evaluate`; the usefulness parts see a neutral,
        unmeasured server, so only `unsafe` and the predicted capacity are meaningful here.
        """
        return evaluate(change, self.context(NEUTRAL), "kv_cache", considered=True)


def rules_for(
    info: ServerInfo, settings: DiagnoseSettings, *, measured: bool = True
) -> ServerRules:
    """`measured=False` (judging a change alone) assumes SGLang's default fraction if none is
    reported, where a diagnosis refuses to guess."""
    gpu, notes = resolve_gpu_memory(info, settings)
    fraction = info.mem_fraction_static
    if fraction is None and measured:
        raise ValueError("server info has no mem_fraction_static; is this SGLang?")
    fraction = 0.85 if fraction is None else fraction
    host: HostMemory | None = None
    if settings.host is not None:
        try:
            host = settings.host.memory()
        except HostUnavailable as exc:
            notes.append(f"host memory unknown ({exc})")
    return ServerRules(info, capacity_model(info, fraction, gpu), host, settings, notes)


def bottleneck_of(info: ServerInfo, m: Measurement) -> tuple[Bottleneck, list[str]] | str:
    """The bottleneck over stored measurements (no GPU or host probes), or why not."""
    fraction = info.mem_fraction_static
    if fraction is None:
        return "the server reports no mem_fraction_static; the day is not diagnosed"
    ctx = Context(
        info=info,
        m=m,
        cap=capacity_model(info, fraction, None),
        host=None,
        ranks_on_host=ranks_on_host(info),
        version=parse_version(info.version),
    )
    return analyse(ctx)


def resident_tokens_per_request(ctx: Context) -> float | None:
    """KV a running request holds on average: its prompt plus half its answer so far."""
    m = ctx.m
    if m.avg_prompt_tokens is not None and m.avg_output_tokens is not None:
        return m.avg_prompt_tokens + m.avg_output_tokens / 2
    if m.token_usage and m.running:
        return m.token_usage * ctx.info.max_total_num_tokens / m.running
    return None


def requests_that_fit(ctx: Context, tokens: int | None = None) -> float | None:
    per = resident_tokens_per_request(ctx)
    if not per:
        return None
    return (tokens or ctx.info.max_total_num_tokens) * 0.9 / per


def retractions_per_minute(ctx: Context) -> float | None:
    if ctx.m.retractions is None or ctx.m.window_s <= 0:
        return None
    return ctx.m.retractions / (ctx.m.window_s / 60)


def analyse(ctx: Context) -> tuple[Bottleneck, list[str]]:
    m = ctx.m
    usage = m.token_usage
    cap = ctx.info.max_total_num_tokens
    evidence: list[str] = []
    running_cap = ctx.info.effective_max_running_requests
    usage_text = "unknown" if usage is None else f"{usage:.2f}"
    evidence.append(
        f"on average {m.running:.1f} requests ran and {m.queued:.1f} waited "
        f"(queue non-empty {m.queue_nonempty_fraction:.0%} of the time, at most "
        f"{m.queued_max:.0f}); KV token usage {usage_text} of {cap:,} tokens"
    )
    per = resident_tokens_per_request(ctx)
    if per is not None and m.avg_output_tokens is not None and m.avg_prompt_tokens is not None:
        fit = requests_that_fit(ctx)
        evidence.append(
            f"completed requests averaged {m.avg_prompt_tokens:,.0f} prompt + "
            f"{m.avg_output_tokens:,.0f} output tokens; a running request holds ~{per:,.0f} "
            f"tokens of KV, so ~{fit:.0f} fit in {cap:,} tokens"
        )
    if m.usage_trend is not None and m.usage_trend[1] - m.usage_trend[0] > 0.15:
        evidence.append(
            f"token usage rose from {m.usage_trend[0]:.2f} to {m.usage_trend[1]:.2f} during the "
            "window: the server is still filling up (recent restart or a new burst); measure "
            "again in a few minutes for a settled picture"
        )
    rpm = retractions_per_minute(ctx)
    if rpm is not None:
        evidence.append(f"{m.retractions} retractions in {m.window_s / 60:.1f} min ({rpm:.1f}/min)")
    elif m.retractions_seen_in_gauge:
        evidence.append(f"retractions seen in {m.retractions_seen_in_gauge} scrapes")
    if m.queue_nonempty_fraction < 0.2 and m.queued < 1:
        evidence.append(
            "nothing waits: the server takes every request the clients send, so "
            "throughput equals the offered load and no server change can raise it"
        )
        return "client", evidence
    retracting = bool((rpm or 0) > 0 or m.retractions_seen_in_gauge)
    if usage is not None and m.usage_trend is not None and m.usage_trend[1] > usage:
        usage = m.usage_trend[1]  # judge a filling server by where it got to, not its ramp
    if usage is not None and (usage >= SATURATED_USAGE or (retracting and usage >= 0.7)):
        evidence.append(
            f"requests wait while the KV pool is {usage:.0%} used"
            + (" and running requests are being retracted" if retracting else "")
            + ": admission is limited by KV-cache capacity"
        )
        return "kv_cache", evidence
    if running_cap and m.running >= 0.95 * running_cap:
        evidence.append(
            f"the batch is at max_running_requests ({running_cap}) while the KV "
            "pool has room: the running-request cap limits the batch"
        )
        return "compute", evidence
    if (
        m.prompt_tokens_per_s
        and m.effective
        and m.effective.mean > 0
        and m.prompt_tokens_per_s > 4 * m.effective.mean
    ):
        evidence.append(
            f"prompts dominate ({m.prompt_tokens_per_s:,.0f} prompt tok/s vs "
            f"{m.effective.mean:,.0f} output tok/s) while the pool has room: prefill limits"
        )
        return "prefill", evidence
    evidence.append(
        f"requests wait although the KV pool is only {usage_text} used: SGLang's "
        "admission looks too conservative (its guide suggests a lower "
        "--schedule-conservativeness)"
    )
    return "unknown", evidence


# ----------------------------------------------------------------------------- proposals
def propose(ctx: Context, bottleneck: Bottleneck) -> list[Option]:
    options: list[Option] = []
    cap = ctx.cap
    f = cap.mem_fraction_static
    safe = cap.safe_max_fraction(ctx.hicache_on)
    if bottleneck == "client":
        options.append(
            Option(
                title="raise client concurrency",
                change={},
                verdict="recommended",
                predicted_max_total_num_tokens=None,
                predicted_gain=None,
                risk="none on the server",
                reasons=[
                    f"only {ctx.m.running:.1f} requests ran and none waited: send more at once "
                    "(the server has room for "
                    f"~{requests_that_fit(ctx) or 0:.0f})"
                ],
            )
        )
    if safe > f + 0.004:
        options.append(evaluate({"mem_fraction_static": safe}, ctx, bottleneck))
    unsafe_next = round(max(safe, f) + 0.01, 2)
    options.append(evaluate({"mem_fraction_static": unsafe_next}, ctx, bottleneck))
    if KV_DTYPE_BYTES.get(cap.kv_dtype, 2.0) >= 2.0:
        options.append(evaluate({"kv_cache_dtype": "fp8_e4m3"}, ctx, bottleneck))
    if not ctx.hicache_on:
        hicache = hicache_proposal(ctx, bottleneck)
        if hicache is not None:
            options.append(hicache)
    rpm = retractions_per_minute(ctx)
    if bottleneck == "kv_cache" and rpm is not None and rpm > RETRACTIONS_PER_MIN_HIGH:
        current = float(ctx.info.arg("schedule_conservativeness") or 1.0)
        options.append(
            evaluate({"schedule_conservativeness": round(current * 1.3, 2)}, ctx, bottleneck)
        )
    if bottleneck == "unknown":
        current = float(ctx.info.arg("schedule_conservativeness") or 1.0)
        options.append(
            evaluate({"schedule_conservativeness": round(current * 0.5, 2)}, ctx, bottleneck)
        )
    if bottleneck == "compute" and ctx.info.effective_max_running_requests:
        options.append(
            evaluate(
                {"max_running_requests": ctx.info.effective_max_running_requests * 2},
                ctx,
                bottleneck,
            )
        )
    return options


def _hicache_refused(ctx: Context, risk: str, reason: str) -> Option:
    return Option(
        title="hierarchical cache (host RAM)",
        change={"enable_hierarchical_cache": True},
        verdict="unsafe",
        predicted_max_total_num_tokens=ctx.info.max_total_num_tokens,
        predicted_gain=None,
        risk=risk,
        reasons=[reason],
    )


def hicache_proposal(ctx: Context, bottleneck: Bottleneck) -> Option | None:
    """Size a host pool that all ranks together fit in host RAM; judge whether it helps."""
    if ctx.host is None:
        return _hicache_refused(
            ctx,
            "host OOM if the per-rank pools overcommit RAM",
            "host RAM is unknown (configure host_ram_gib or run on the GPU host), so a host "
            "pool cannot be checked against it",
        )
    budget = HostBudget.of(ctx.host.total_gib, ctx.host.available_gib, ctx.ranks_on_host)
    device_gb = ctx.info.max_total_num_tokens * ctx.cap.bytes_per_token / 1e9
    per_rank_gb = min(budget.per_rank_budget_gib * GIB / 1e9, 2 * device_gb)
    size_gb = math.floor(per_rank_gb)
    if size_gb <= 0 or (not ctx.per_rank_checked and size_gb <= device_gb):
        return _hicache_refused(
            ctx,
            "host OOM",
            f"the host cannot hold a pool larger than the GPU pool ({device_gb:.1f} GB) on each "
            f"of {ctx.ranks_on_host} ranks: {budget.per_rank_budget_gib:.1f} GiB per rank is "
            "available after SGLang's 10 GiB reserve and a 10% margin",
        )
    return evaluate({"enable_hierarchical_cache": True, "hicache_size": size_gb}, ctx, bottleneck)


def _gain(ctx: Context, bottleneck: Bottleneck, tokens_new: int) -> tuple[float, float] | None:
    """Throughput change from more KV room: linear in running requests at best, half at worst."""
    m = ctx.m
    current = ctx.info.max_total_num_tokens
    if bottleneck != "kv_cache" or m.running <= 0:
        return (0.0, 0.0)
    demand = m.running + m.queued
    running_new = min(demand, m.running * tokens_new / current)
    high = max(0.0, running_new / m.running - 1)
    return (high / 2, high)


def evaluate(
    change: dict[str, Any], ctx: Context, bottleneck: Bottleneck, considered: bool = False
) -> Option:
    """Judge one change: the worst verdict of its parts wins."""
    cap = ctx.cap
    fraction = float(change.get("mem_fraction_static", cap.mem_fraction_static))
    dtype = str(change.get("kv_cache_dtype", cap.kv_dtype))
    hicache = bool(change.get("enable_hierarchical_cache", ctx.hicache_on))
    bytes_new = (
        cap.bytes_per_token * KV_DTYPE_BYTES.get(dtype, 2.0) / KV_DTYPE_BYTES.get(cap.kv_dtype, 2.0)
    )
    if fraction == cap.mem_fraction_static and bytes_new == cap.bytes_per_token:
        tokens = ctx.info.max_total_num_tokens
    else:
        tokens = cap.tokens_at(fraction, bytes_new)
    if "max_total_tokens" in change:
        tokens = min(tokens, int(change["max_total_tokens"]))
    verdicts: list[Verdict] = []
    reasons: list[str] = []
    risks: list[str] = []
    current = ctx.info.max_total_num_tokens
    gain = _gain(ctx, bottleneck, tokens)
    kv_bound = bottleneck == "kv_cache"

    if "mem_fraction_static" in change or ("enable_hierarchical_cache" in change and hicache):
        room = cap.activation_room_gib(fraction, hicache)
        if fraction <= cap.min_fraction():
            verdicts.append("unsafe")
            reasons.append(
                f"at {fraction:g} the weights leave no room for the KV cache: SGLang "
                f"refuses to start below ~{cap.min_fraction():.3f}"
            )
        elif room < ACTIVATION_FLOOR_GIB:
            verdicts.append("unsafe")
            reasons.append(
                f"{fraction:g} leaves {(1 - fraction) * cap.gpu.pre_gib:.2f} GiB outside the "
                f"static pool; CUDA graphs take {cap.graph_gib:.2f} GiB"
                + (" and the hierarchical cache's buffers 0.50 GiB" if hicache else "")
                + f", so {room:.2f} GiB remain for activations, below the "
                f"{ACTIVATION_FLOOR_GIB:g} GiB SGLang needs: it would start, then run out of GPU "
                "memory under load (as 0.93 did in the incident)"
            )
            risks.append("GPU OOM under load")
        elif "mem_fraction_static" in change:
            reasons.append(
                f"{fraction:g} keeps {room:.2f} GiB for activations after "
                f"{cap.graph_gib:.2f} GiB of CUDA graphs (floor "
                f"{ACTIVATION_FLOOR_GIB:g} GiB + 0.5 GiB margin)"
            )
            if tokens <= current:
                verdicts.append("not_useful")
                reasons.append(f"capacity would not grow ({tokens:,} vs {current:,} tokens)")
            elif not kv_bound:
                verdicts.append("not_useful")
                reasons.append(
                    f"capacity would grow to {tokens:,} tokens, but the bottleneck is "
                    f"{bottleneck}, not the KV cache"
                )
            else:
                verdicts.append("recommended" if cap.gpu.exact else "possible")
                fit = ""
                if ctx.m.avg_prompt_tokens is not None:
                    fit = (
                        f"; ~{requests_that_fit(ctx, tokens) or 0:.0f} requests of the "
                        "observed size fit"
                    )
                reasons.append(
                    f"capacity {current:,} -> {tokens:,} tokens (+{tokens / current - 1:.0%}){fit}"
                )
                if not cap.gpu.exact:
                    reasons.append("GPU memory was estimated, so the prediction is approximate")
                risks.append(
                    f"{ctx.m.running + ctx.m.queued:.0f} in-flight requests are "
                    "dropped by the restart"
                )

    if "kv_cache_dtype" in change:
        if KV_DTYPE_BYTES.get(dtype, 2.0) < KV_DTYPE_BYTES.get(cap.kv_dtype, 2.0):
            verdicts.append("needs_opt_in")
            reasons.append(f"{dtype} halves the bytes per token: {current:,} -> {tokens:,} tokens")
            reasons.append(
                "FP8 KV costs accuracy: without calibrated scales SGLang uses 1.0, and "
                "hard reasoning evals drop a few points; only with an explicit opt-in"
            )
            risks.append("answer quality")
        else:
            verdicts.append("not_useful")
            reasons.append(f"{dtype} does not shrink the KV cache")

    if hicache and (
        "hicache_size" in change
        or "hicache_ratio" in change
        or "enable_hierarchical_cache" in change
    ):
        verdicts.append(_judge_hicache(change, ctx, bottleneck, reasons, risks))
        gain = None

    if "schedule_conservativeness" in change:
        value = float(change["schedule_conservativeness"])
        now = float(ctx.info.arg("schedule_conservativeness") or 1.0)
        rpm = retractions_per_minute(ctx) or 0.0
        usage = ctx.m.token_usage or 0.0
        if value > now and rpm > RETRACTIONS_PER_MIN_HIGH:
            verdicts.append("possible")
            reasons.append(
                f"{rpm:.1f} retractions/min re-prefill work; admitting more cautiously "
                f"({now:g} -> {value:g}) trades a little concurrency for fewer"
            )
        elif value < now and ctx.m.queued > 0 and usage < SATURATED_USAGE:
            verdicts.append("possible")
            reasons.append(
                f"requests wait while usage is {usage:.2f}: admitting more eagerly "
                f"({now:g} -> {value:g}) fills the pool"
            )
        else:
            verdicts.append("not_useful")
            reasons.append("neither frequent retractions nor an under-used pool with a queue")
        gain = None

    if "max_running_requests" in change:
        limit = ctx.info.effective_max_running_requests
        if bottleneck == "compute" and limit and int(change["max_running_requests"]) > limit:
            verdicts.append("possible")
            reasons.append(f"the batch sits at the cap of {limit} while the pool has room")
        else:
            verdicts.append("not_useful")
            reasons.append("the running-request cap does not limit this server now")
        gain = None

    if "chunked_prefill_size" in change:
        size = int(change["chunked_prefill_size"])
        now_size = int(ctx.info.arg("chunked_prefill_size") or 8192)
        need = ACTIVATION_FLOOR_GIB * max(size, 2048) / max(now_size, 2048)
        room = cap.activation_room_gib(fraction, hicache)
        if size == -1 or (size > now_size and room < need):
            verdicts.append("unsafe")
            reasons.append(
                f"larger prefill chunks need ~{need:.1f} GiB of activations; "
                f"{room:.2f} GiB are left"
            )
            risks.append("GPU OOM in prefill")
        elif bottleneck == "prefill" and size > now_size:
            verdicts.append("possible")
            reasons.append(
                "prefill limits throughput and the activation headroom allows larger chunks"
            )
        elif size < now_size:
            verdicts.append("possible" if bottleneck in ("prefill", "kv_cache") else "not_useful")
            reasons.append(
                "smaller chunks interrupt decoding for less time and need less "
                "activation memory, at a small prefill cost"
            )
        else:
            verdicts.append("not_useful")
            reasons.append("prefill does not limit this server")
        gain = None

    for key in ("max_total_tokens", "page_size", "max_prefill_tokens", "hicache_write_policy"):
        if key in change and not verdicts:
            verdicts.append("not_useful")
            reasons.append(f"{key} does not raise KV capacity")

    verdict: Verdict = min(verdicts, key=lambda v: VERDICT_ORDER[v]) if verdicts else "not_useful"
    risks.append("restart: the server is down while it reloads the model")
    return Option(
        title=_title(change),
        change=dict(change),
        verdict=verdict,
        predicted_max_total_num_tokens=tokens,
        predicted_gain=gain if verdict not in ("unsafe",) else None,
        risk="; ".join(dict.fromkeys(risks)),
        reasons=reasons,
        considered=considered,
    )


def _judge_hicache(
    change: dict[str, Any],
    ctx: Context,
    bottleneck: Bottleneck,
    reasons: list[str],
    risks: list[str],
) -> Verdict:
    cap = ctx.cap
    device_tokens = ctx.info.max_total_num_tokens
    size_gb = float(change.get("hicache_size") or 0)
    ratio = float(change.get("hicache_ratio") or 2.0)
    per_rank_gb = size_gb if size_gb > 0 else ratio * device_tokens * cap.bytes_per_token / 1e9
    host_tokens = int(per_rank_gb * 1e9 // cap.bytes_per_token)
    ranks = ctx.ranks_on_host
    total_gb = per_rank_gb * ranks
    if ctx.host is None:
        reasons.append(
            f"{ranks} ranks x {per_rank_gb:.1f} GB = {total_gb:.0f} GB of pinned host "
            "RAM, and host RAM is unknown (configure host_ram_gib): cannot be checked"
        )
        risks.append("host OOM")
        return "unsafe"
    budget = HostBudget.of(ctx.host.total_gib, ctx.host.available_gib, ranks)
    usable_gb = budget.per_rank_budget_gib * ranks * GIB / 1e9
    arithmetic = (
        f"{ranks} ranks x {per_rank_gb:.1f} GB = {total_gb:.0f} GB of pinned host RAM "
        f"(every rank builds its own pool); the host has {ctx.host.total_gib:.0f} GiB, "
        f"{ctx.host.available_gib:.0f} GiB available, {usable_gb:.0f} GB usable after "
        "SGLang's 10 GiB reserve and a 10% margin"
    )
    if total_gb > usable_gb:
        reasons.append(arithmetic)
        if ctx.per_rank_checked:
            reasons.append("SGLang refuses to start (it splits the host budget per rank)")
        else:
            reasons.append(
                "SGLang checks each rank against the whole host, so it starts, pins "
                "the memory and is killed by the host's OOM killer under load"
            )
        risks.append("host OOM")
        return "unsafe"
    if not ctx.per_rank_checked and host_tokens <= device_tokens:
        reasons.append(
            f"the host pool ({host_tokens:,} tokens) must be larger than the GPU pool "
            f"({device_tokens:,}): SGLang {ctx.info.version} refuses to start"
        )
        return "unsafe"
    reasons.append(arithmetic + ": fits")
    reasons.append(
        "HiCache keeps evicted prefixes in host RAM; it does not add room for running "
        "requests (max_total_num_tokens stays the same)"
    )
    m = ctx.m
    prompt_heavy = (
        m.avg_prompt_tokens is not None
        and m.avg_output_tokens is not None
        and m.avg_prompt_tokens >= 2 * m.avg_output_tokens
    )
    reuse = m.cached_fraction
    if bottleneck != "kv_cache":
        reasons.append("the KV pool is not the bottleneck, so little is evicted")
        return "not_useful"
    if not prompt_heavy:
        reasons.append(
            "requests are dominated by generation"
            + (
                f" ({m.avg_output_tokens:,.0f} output vs {m.avg_prompt_tokens:,.0f} prompt tokens)"
                if m.avg_output_tokens and m.avg_prompt_tokens
                else ""
            )
            + ": a reloaded prefix saves little, and HiCache adds decode cost (sglang#26305)"
        )
        return "not_useful"
    if reuse is not None and reuse >= 0.10:
        reasons.append(
            f"prompts are long ({m.avg_prompt_tokens:,.0f} tokens) and "
            f"{reuse:.0%} of prompt tokens already hit the cache while the pool is "
            "full: prefixes come back and are being evicted, so a host tier should "
            "serve them instead of recomputing"
        )
        risks.append("pinned host memory")
        return "recommended"
    reasons.append(
        "prompts are long but little is reused now: this helps only if requests share "
        "prefixes (multi-turn chat, agents, shared documents)"
    )
    return "possible"


def _title(change: dict[str, Any]) -> str:
    if not change:
        return "no server change"
    parts = []
    for k, v in change.items():
        if k == "enable_hierarchical_cache" and v is True and len(change) > 1:
            continue
        if isinstance(v, bool):
            text = str(v).lower()
        elif isinstance(v, float):
            text = f"{v:g}"
        else:
            text = str(v)
        parts.append(f"{k}={text}")
    return ", ".join(parts)


# An unmeasured, saturated server: what `judge` evaluates a change against.
NEUTRAL = Measurement(
    window_s=0.0,
    batch_s=0.0,
    batches=0,
    lag1=0.0,
    stop_reason="not measured",
    source="metrics",
    generation=None,
    effective=None,
    prompt_tokens_per_s=None,
    requests_per_s=None,
    completed_requests=None,
    avg_prompt_tokens=None,
    avg_output_tokens=None,
    running=1.0,
    queued=1.0,
    queued_max=1.0,
    queue_nonempty_fraction=1.0,
    token_usage=0.9,
    cache_hit_rate=None,
    cached_fraction=None,
    retractions=None,
    retractions_seen_in_gauge=0,
)
