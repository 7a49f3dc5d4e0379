"""Command line of `python -m sim.launch_server`: SGLang's own flags plus a few twin-only ones.

SGLang flags keep SGLang's names, types, choices and defaults, so a launcher builds the same
command line for the twin and for a real server. Unknown `--flags` are accepted (SGLang has
hundreds) and echoed in server info. Malformed values are refused the way argparse refuses them in
SGLang: `error: argument --X: invalid ... value` on stderr and exit status 2 (`--hicache-size 40.0`
included: SGLang declares it `type=int`). On top of that the twin refuses, with the same exit
status, values SGLang parses but that make no sense (a memory fraction outside (0, 1), a count
of zero), and what SGLang asserts before start-up (a chunk that the page size does not divide).
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, field, replace
from typing import Any

from sim.flags import (
    HIDDEN_FLAGS,
    KV_DTYPE_CHOICES_0523,
    KV_DTYPE_CHOICES_055,
    PEAK_SCALE_ENV,
    WORKLOAD_PROFILES,
    WRITE_POLICIES,
    build_parser,
    human_readable_int,
)
from sim.memory import (
    Capacity,
    StartupFailure,
    default_mem_fraction_static,
    effective_max_running_requests,
    gpu_defaults,
    max_req_input_len,
    plan_capacity,
)
from sim.models import KV_DTYPE_BYTES
from sim.presets import PRESETS, Preset, get_preset
from sim.shape_args import max_running_arg, shape_args, speculation, swa_ratio
from sim.shapes import (
    KvShape,
    Layout,
    Speculation,
    per_rank_chunked_prefill,
    per_rank_conservativeness,
    resolve_layout,
)
from sim.version import SGLangVersion

# The flag table is `sim.flags`; callers have always found the parser here.
__all__ = [
    "KV_DTYPE_CHOICES_0523",
    "KV_DTYPE_CHOICES_055",
    "WORKLOAD_PROFILES",
    "WRITE_POLICIES",
    "TwinConfig",
    "build_parser",
    "human_readable_int",
    "parse_unknown",
    "resolve",
]


@dataclass
class TwinConfig:
    """Resolved server arguments (SGLang field names) plus twin settings."""

    server_args: dict[str, Any]
    unknown_args: dict[str, Any]
    preset: Preset
    version: SGLangVersion
    time_scale: float
    host_ram_gib: float
    seed: int
    workload: str | None
    concurrency: int | None
    answer_tokens: int
    kv_dtype: str  # resolved, never "auto"
    capacity: Capacity
    max_running_requests: int
    context_len: int
    page_size: int
    chunked_prefill_size: int  # per scheduler; -1 disables chunking
    attention_tp: int
    layout: Layout
    speculation: Speculation | None = None
    spec_accept_length: float = 0.0  # what sglang:spec_accept_length reports (0: no speculation)
    # share of greedy answers (OpenAI-compatible API) that differ under an 8-bit KV cache; 0:
    # the twin answers the same whatever the KV dtype
    fp8_answer_drift: float = 0.0
    launch_command: list[str] = field(default_factory=list)
    failure: StartupFailure | None = None  # the memory arithmetic refused this configuration

    @property
    def max_req_input_len(self) -> int:
        return max_req_input_len(self.context_len, self.capacity.max_total_num_tokens)

    @property
    def ranks_on_host(self) -> int:
        sa = self.server_args
        dp = 1 if sa["enable_dp_attention"] else sa["dp_size"]
        return int(sa["tp_size"] * sa["pp_size"] * dp // max(1, sa["nnodes"]))


def _check_ranges(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """Values SGLang parses but that make no sense, refused before start-up (exit 2).

    SGLang itself asserts only `schedule_conservativeness >= 0` at this stage and fails later,
    or not at all, on the rest; kvpilot never emits any of them (playbooks/server_args.py).
    """
    mfs = ns.mem_fraction_static
    if mfs is not None and not 0 < mfs < 1:
        parser.error(
            f"argument --mem-fraction-static: must be between 0 and 1 (exclusive), got '{mfs}'"
        )
    for flag in ("max_total_tokens", "max_running_requests", "max_prefill_tokens", "page_size"):
        value = getattr(ns, flag)
        if value is not None and value <= 0:
            name = "--" + flag.replace("_", "-")
            parser.error(f"argument {name}: must be a positive integer, got '{value}'")
    for flag in ("schedule_conservativeness", "hicache_ratio"):
        value = getattr(ns, flag)
        if value is not None and (not math.isfinite(value) or value <= 0):
            name = "--" + flag.replace("_", "-")
            parser.error(f"argument {name}: must be a positive number, got '{value}'")
    if ns.hicache_size < 0:
        parser.error(f"argument --hicache-size: must be >= 0 GB, got {ns.hicache_size}")


def parse_unknown(tokens: list[str]) -> dict[str, Any]:
    """Turn leftover `--some-flag [value]` tokens into {"some_flag": value-or-True}."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--") or len(tok) <= 2:
            raise ValueError(f"unrecognized arguments: {tok}")
        name, eq, value = tok[2:].partition("=")
        key = name.replace("-", "_")
        if eq:
            out[key] = value
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            out[key] = tokens[i + 1]
            i += 1
        else:
            out[key] = True
        i += 1
    return out


def _replace_preset_memory(preset: Preset, ns: argparse.Namespace) -> Preset:
    mem = preset.memory
    if ns.sim_gpu_gib is not None:
        mem = replace(
            mem,
            free_before_load_gib=ns.sim_gpu_gib,
            gpu_memory_mib=int(ns.sim_gpu_gib * 1024),
        )
    if ns.sim_weights_gib is not None:
        mem = replace(mem, weights_gib=ns.sim_weights_gib)
    if ns.sim_other_static_gib is not None:
        mem = replace(mem, other_static_gib=ns.sim_other_static_gib)
    return replace(preset, memory=mem) if mem is not preset.memory else preset


def _parse(
    parser: argparse.ArgumentParser, argv: list[str]
) -> tuple[argparse.Namespace, dict[str, Any], SGLangVersion]:
    """The flags, the unknown ones, and the SGLang version, each refused like argparse does."""
    ns, rest = parser.parse_known_args(argv)
    try:
        unknown = parse_unknown(rest)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        version = SGLangVersion.parse(ns.sglang_version)
    except ValueError as exc:
        parser.error(f"argument --sglang-version: {exc}")
    choices = KV_DTYPE_CHOICES_0523 if version.refactored else KV_DTYPE_CHOICES_055
    if ns.kv_cache_dtype not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        parser.error(
            f"argument --kv-cache-dtype: invalid choice: {ns.kv_cache_dtype!r} "
            f"(choose from {allowed})"
        )
    if ns.workload and not ns.concurrency:
        parser.error("argument --workload: needs --concurrency N (requests kept in flight)")
    _check_ranges(parser, ns)
    return ns, unknown, version


def _scale_step_time(preset: Preset, factor: float) -> Preset:
    """Every batch ``factor`` times as long: times multiplied, rates divided."""
    if factor == 1.0:
        return preset
    st = preset.step
    step = replace(
        st,
        decode_base_s=st.decode_base_s * factor,
        mem_bw_bytes_per_s=st.mem_bw_bytes_per_s / factor,
        per_seq_s=st.per_seq_s * factor,
        prefill_base_s=st.prefill_base_s * factor,
        prefill_tokens_per_s=st.prefill_tokens_per_s / factor,
        host_link_bytes_per_s=st.host_link_bytes_per_s / factor,
        hicache_decode_overhead_s=st.hicache_decode_overhead_s * factor,
    )
    return replace(preset, step=step)


def _peak_scale(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> float:
    """The hidden activation peak: the flag, else the environment, else 1 (the model)."""
    if ns.sim_activation_peak_scale is not None:
        return float(ns.sim_activation_peak_scale)
    text = os.environ.get(PEAK_SCALE_ENV, "").strip()
    if not text:
        return 1.0
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        parser.error(f"{PEAK_SCALE_ENV}: must be a positive number, got {text!r}")
    return value


def _resolve_preset(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> Preset:
    """The preset with the twin's overrides: memory, start-up time, step time, no CUDA graphs,
    the hidden activation peak."""
    preset = _replace_preset_memory(get_preset(ns.preset), ns)
    if ns.sim_startup_s is not None:
        preset = replace(preset, startup_s=ns.sim_startup_s)
    preset = _scale_step_time(preset, ns.sim_step_time_factor)
    if ns.disable_cuda_graph:
        preset = replace(preset, memory=replace(preset.memory, graph_gib=0.0))
    scale = _peak_scale(parser, ns)
    if scale != 1.0:
        preset = replace(preset, memory=replace(preset.memory, activation_peak_scale=scale))
    return preset


def _without_hidden(argv: list[str]) -> list[str]:
    """The command line as the server reports it: the hidden twin flags and their values left
    out, so nothing kvpilot reads can tell it the true activation peak."""
    out: list[str] = []
    skip = False
    for tok in argv:
        if skip:
            skip = False
            continue
        name = tok.partition("=")[0]
        if name in HIDDEN_FLAGS:
            skip = "=" not in tok
            continue
        out.append(tok)
    return out


def _parallelism(
    parser: argparse.ArgumentParser, ns: argparse.Namespace, preset: Preset, refactored: bool
) -> Layout:
    """TP, replicas and attention DP as asked (TP defaults to the preset's), or exit 2."""
    tp = ns.tp_size if ns.tp_size is not None else preset.tp_size
    try:
        layout = resolve_layout(tp, ns.dp_size, ns.attn_dp_size, ns.enable_dp_attention, refactored)
    except ValueError as exc:
        parser.error(str(exc))
    gpus = tp * ns.pp_size * layout.dp
    if gpus > preset.gpus_per_host * ns.nnodes:
        parser.error(
            f"the preset {preset.name} has {preset.gpus_per_host} GPUs per node; "
            f"tp*pp*dp = {gpus} does not fit"
        )
    return layout


def _chunked_prefill(parser: argparse.ArgumentParser, ns: argparse.Namespace, default: int) -> int:
    """The chunk size (SGLang's GPU default when not given); -1 turns chunking off."""
    chunked = ns.chunked_prefill_size if ns.chunked_prefill_size is not None else default
    if chunked == 0 or chunked < -1:
        parser.error(f"argument --chunked-prefill-size: must be -1 (off) or > 0, got {chunked}")
    if chunked > 0 and chunked % (ns.page_size or 1):
        # SGLang asserts this before starting (arg_groups/validation_hook.py check_server_args).
        parser.error("chunked_prefill_size must be divisible by page_size")
    return int(chunked)


def _mem_fraction(
    ns: argparse.Namespace,
    version: SGLangVersion,
    preset: Preset,
    layout: Layout,
    chunked: int,
    graph_bs: int,
) -> float:
    """`--mem-fraction-static`, or SGLang's default for this GPU and layout."""
    if ns.mem_fraction_static is not None:
        return float(ns.mem_fraction_static)
    return default_mem_fraction_static(
        version,
        preset.memory.gpu_memory_mib,
        layout.tp,
        ns.pp_size,
        chunked,
        graph_bs,
        preset.model.is_mla,
        preset.model.multimodal,
        cuda_graphs=not ns.disable_cuda_graph,
        attn_dp_size=layout.attn_dp,
    )


def _capacity(
    preset: Preset,
    version: SGLangVersion,
    mfs: float,
    kv_dtype: str,
    shape: KvShape,
    attention_tp: int,
    page_size: int,
    max_total_tokens: int | None,
) -> tuple[Capacity, StartupFailure | None]:
    """One scheduler's KV pool, or an empty one and the failure when the arithmetic refuses it."""
    try:
        return plan_capacity(
            preset, version, mfs, kv_dtype, attention_tp, page_size, max_total_tokens, shape
        ), None
    except StartupFailure as exc:
        return Capacity(0.0, 0.0, 0.0, shape.full_cell, 0, 0, 0.0, ()), exc


@dataclass(frozen=True)
class _Resolved:
    """The values SGLang derives when a flag is left out, as the server reports them."""

    version: SGLangVersion
    preset: Preset
    layout: Layout
    mem_fraction_static: float
    chunked_prefill_size: int  # as given or defaulted, before the split across attention DP
    page_size: int
    cuda_graph_max_bs: int
    speculation: Speculation | None


def _server_args(ns: argparse.Namespace, r: _Resolved) -> dict[str, Any]:
    """Every server argument under SGLang's field name, as `/server_info` reports them."""
    model = r.preset.model
    refactored = r.version.refactored
    return {
        "model_path": ns.model_path or model.name,
        "tokenizer_path": ns.tokenizer_path or ns.model_path or model.name,
        "served_model_name": ns.served_model_name or ns.model_path or model.name,
        "host": ns.host,
        "port": ns.port,
        "tp_size": r.layout.tp,
        # 0.5.5 reports the attention-DP width as dp_size; 0.5.23 as attn_dp_size.
        "dp_size": r.layout.dp if refactored else r.layout.schedulers,
        "pp_size": ns.pp_size,
        "ep_size": ns.ep_size,
        "nnodes": ns.nnodes,
        # server_args.py::resolved_dict reports it as `attn_dp_size > 1`.
        "enable_dp_attention": r.layout.attn_dp > 1 if refactored else ns.enable_dp_attention,
        "mem_fraction_static": r.mem_fraction_static,
        "max_total_tokens": ns.max_total_tokens,
        "max_running_requests": max_running_arg(ns, r.speculation),
        "max_queued_requests": ns.max_queued_requests,
        "chunked_prefill_size": per_rank_chunked_prefill(r.chunked_prefill_size, r.layout.attn_dp),
        "max_prefill_tokens": ns.max_prefill_tokens,
        "page_size": r.page_size,
        "kv_cache_dtype": ns.kv_cache_dtype,
        "context_length": ns.context_length,
        "schedule_policy": ns.schedule_policy,
        "schedule_conservativeness": per_rank_conservativeness(
            ns.schedule_conservativeness, r.layout.attn_dp
        ),
        "disable_radix_cache": ns.disable_radix_cache,
        "enable_hierarchical_cache": ns.enable_hierarchical_cache,
        "hicache_ratio": ns.hicache_ratio
        if ns.hicache_ratio is not None
        else (None if refactored else 2.0),
        "hicache_size": ns.hicache_size,
        "hicache_write_policy": ns.hicache_write_policy,
        "hicache_io_backend": ns.hicache_io_backend,
        "hicache_mem_layout": ns.hicache_mem_layout
        or ("page_first" if refactored else "layer_first"),
        "hicache_storage_backend": ns.hicache_storage_backend,
        "cuda_graph_max_bs": r.cuda_graph_max_bs,
        # 0.5.23 reports the user's field (None when unset), the resolved value in
        # cuda_graph_config.decode.max_bs
        "cuda_graph_max_bs_decode": ns.cuda_graph_max_bs_decode,
        "disable_cuda_graph": ns.disable_cuda_graph,
        "enable_metrics": ns.enable_metrics,
        "decode_log_interval": ns.decode_log_interval,
        "stream_interval": ns.stream_interval,
        "api_key": ns.api_key,
        "log_level": ns.log_level,
        "skip_server_warmup": ns.skip_server_warmup,
        "trust_remote_code": ns.trust_remote_code,
        "enable_cache_report": ns.enable_cache_report,
        "random_seed": ns.random_seed if ns.random_seed is not None else ns.seed,
        "device": ns.device,
        **shape_args(ns, r.speculation, r.layout, r.version.refactored),
    }


def _derive(
    parser: argparse.ArgumentParser, ns: argparse.Namespace, version: SGLangVersion
) -> _Resolved:
    """SGLang's derived settings, in SGLang's order: layout, GPU defaults, chunk, memory."""
    preset = _resolve_preset(parser, ns)
    layout = _parallelism(parser, ns, preset, version.refactored)
    defaults = gpu_defaults(version, preset.memory.gpu_memory_mib, layout.tp)
    chunked = _chunked_prefill(parser, ns, defaults.chunked_prefill_size)
    graph_bs = ns.cuda_graph_max_bs_decode or ns.cuda_graph_max_bs or defaults.cuda_graph_max_bs
    mfs = _mem_fraction(ns, version, preset, layout, chunked, graph_bs)
    spec = speculation(parser, ns, preset)
    return _Resolved(version, preset, layout, mfs, chunked, ns.page_size or 1, graph_bs, spec)


def _preset_launch_args(argv: list[str]) -> list[str]:
    """The preset's own launch flags, which the command line's come after (and so override)."""
    probe = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    probe.add_argument("--preset", default=None)
    name = probe.parse_known_args(argv)[0].preset
    preset = PRESETS.get(name) if name else None
    return list(preset.launch_args) if preset else []


def resolve(argv: list[str], prog: str = "launch_server.py") -> TwinConfig:
    """Parse and resolve like SGLang's ServerArgs.__post_init__; argparse exits 2 on bad input.

    When the memory arithmetic refuses the configuration the result carries it in `failure`;
    the server then fails the way SGLang does, after loading the weights.
    """
    parser = build_parser(prog)
    argv = [*_preset_launch_args(argv), *argv]
    ns, unknown, version = _parse(parser, argv)
    r = _derive(parser, ns, version)
    preset, model = r.preset, r.preset.model
    context_len = ns.context_length or model.context_length
    kv_dtype = model.resolve_kv_dtype(ns.kv_cache_dtype)
    if kv_dtype not in KV_DTYPE_BYTES:
        parser.error(f"argument --kv-cache-dtype: {kv_dtype!r} is not supported by the twin")
    shape = model.kv_shape(
        kv_dtype,
        r.layout.attention_tp,
        r.speculation.draft_layers if r.speculation else 0,
        swa_ratio(ns),
    )
    capacity, failure = _capacity(
        preset,
        version,
        r.mem_fraction_static,
        kv_dtype,
        shape,
        r.layout.attention_tp,
        r.page_size,
        ns.max_total_tokens,
    )
    max_running = effective_max_running_requests(
        max(2, capacity.max_total_num_tokens),
        context_len,
        max_running_arg(ns, r.speculation),
        r.layout.attn_dp,
    )
    return TwinConfig(
        server_args=_server_args(ns, r),
        unknown_args=unknown,
        preset=preset,
        version=version,
        time_scale=ns.time_scale,
        host_ram_gib=ns.host_ram_gb if ns.host_ram_gb is not None else preset.host_ram_gib,
        seed=ns.seed,
        workload=ns.workload,
        concurrency=ns.concurrency,
        answer_tokens=ns.answer_tokens or preset.answer_tokens,
        kv_dtype=kv_dtype,
        capacity=capacity,
        max_running_requests=max_running,
        context_len=context_len,
        page_size=r.page_size,
        chunked_prefill_size=per_rank_chunked_prefill(r.chunked_prefill_size, r.layout.attn_dp),
        attention_tp=r.layout.attention_tp,
        layout=r.layout,
        speculation=r.speculation,
        spec_accept_length=(ns.sim_spec_accept_length or 2.5) if r.speculation else 0.0,
        fp8_answer_drift=min(1.0, max(0.0, ns.sim_fp8_answer_drift)),
        launch_command=_without_hidden(argv),
        failure=failure,
    )
