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
import re
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

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
from sim.presets import DEFAULT_PRESET, PRESETS, Preset, get_preset
from sim.version import DEFAULT_VERSION, SGLangVersion

KV_DTYPE_CHOICES_055 = ["auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16", "fp4_e2m1"]
KV_DTYPE_CHOICES_0523 = [
    "auto",
    "fp8_e5m2",
    "fp8_e4m3",
    "mxfp8",
    "bf16",
    "bfloat16",
    "nvfp4",
    "fp4_mx_block16",
]
WRITE_POLICIES = ["write_back", "write_through", "write_through_selective"]
WORKLOAD_PROFILES = ["incident", "multi-turn", "short-chat"]


def _positive_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def human_readable_int(value: str) -> int:
    """SGLang 0.5.23's parser of token counts (`sglang/srt/utils/common.py`, same name, so argparse
    words its errors the same): a plain integer, or SI (`25.6k`) / IEC (`1Ki`) suffixes."""
    value = value.strip()
    si_multiplier = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    iec_multiplier = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix in iec_multiplier:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'. "
                    f"Use an integer IEC value such as '{int(Decimal(number))}{suffix}', "
                    f"or an SI value such as '{number}{suffix[0]}'."
                )
            return int(number) * iec_multiplier[suffix]
        return int(Decimal(number) * si_multiplier[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. "
            "Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes (1Ki, 1Mi). "
            "Suffixes are case-sensitive."
        ) from None


def build_parser(prog: str = "launch_server.py") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, allow_abbrev=False)
    # --- SGLang server flags (names and defaults as in SGLang's ServerArgs) ---
    p.add_argument("--model-path", "--model", dest="model_path", type=str, default=None)
    p.add_argument("--tokenizer-path", type=str, default=None)
    p.add_argument("--served-model-name", type=str, default=None)
    p.add_argument("--host", type=str, default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument(
        "--tp-size", "--tensor-parallel-size", dest="tp_size", type=_positive_int, default=None
    )
    p.add_argument(
        "--dp-size", "--data-parallel-size", dest="dp_size", type=_positive_int, default=1
    )
    p.add_argument(
        "--pp-size", "--pipeline-parallel-size", dest="pp_size", type=_positive_int, default=1
    )
    p.add_argument(
        "--ep-size", "--expert-parallel-size", dest="ep_size", type=_positive_int, default=1
    )
    p.add_argument("--nnodes", type=_positive_int, default=1)
    p.add_argument("--enable-dp-attention", action="store_true")
    # The flags kvpilot may change carry SGLang 0.5.23's argparse types exactly
    # (sglang/srt/arg_groups/fields/schedule.py and memory.py, same field names); the twin's
    # range checks on them run after parsing, in `_check_ranges`.
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--max-total-tokens", type=human_readable_int, default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--max-queued-requests", type=_positive_int, default=None)
    p.add_argument("--chunked-prefill-size", type=int, default=None)
    p.add_argument("--max-prefill-tokens", type=human_readable_int, default=16384)
    p.add_argument("--page-size", type=int, default=None)
    p.add_argument("--kv-cache-dtype", type=str, default="auto")
    p.add_argument("--context-length", type=_positive_int, default=None)
    p.add_argument(
        "--schedule-policy",
        type=str,
        default="fcfs",
        choices=["fcfs", "lpm", "random", "dfs-weight", "lof", "priority"],
    )
    p.add_argument("--schedule-conservativeness", type=float, default=1.0)
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument(
        "--enable-hierarchical-cache",
        "--enable-hicache",
        dest="enable_hierarchical_cache",
        action="store_true",
    )
    p.add_argument("--hicache-ratio", type=float, default=None)
    p.add_argument("--hicache-size", type=int, default=0)  # GB
    p.add_argument(
        "--hicache-write-policy", type=str, default="write_through", choices=WRITE_POLICIES
    )
    p.add_argument(
        "--hicache-io-backend",
        type=str,
        default="kernel",
        choices=["direct", "kernel", "kernel_ascend"],
    )
    p.add_argument("--hicache-mem-layout", type=str, default=None)
    p.add_argument("--hicache-storage-backend", type=str, default=None)
    p.add_argument("--cuda-graph-max-bs", type=_positive_int, default=None)
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--decode-log-interval", type=_positive_int, default=40)
    p.add_argument("--stream-interval", type=_positive_int, default=1)
    p.add_argument("--api-key", type=str, default=None)
    p.add_argument("--log-level", type=str, default="info")
    p.add_argument("--skip-server-warmup", action="store_true")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--enable-cache-report", action="store_true")
    p.add_argument("--random-seed", type=int, default=None)
    p.add_argument(
        "--device",
        type=str,
        default="cuda",
        help="cuda for a GPU server; cpu only changes the labels SGLang prints",
    )
    # --- twin-only flags ---
    twin = p.add_argument_group("twin-only (not SGLang flags)")
    twin.add_argument("--preset", type=str, default=DEFAULT_PRESET, choices=sorted(PRESETS))
    twin.add_argument("--sglang-version", type=str, default=DEFAULT_VERSION)
    twin.add_argument(
        "--time-scale",
        type=_positive_float,
        default=1.0,
        help="the simulated world runs K times faster than the wall clock",
    )
    twin.add_argument(
        "--host-ram-gb",
        type=_positive_float,
        default=None,
        help="host RAM in GiB (default: the preset's)",
    )
    twin.add_argument("--seed", type=int, default=0)
    twin.add_argument(
        "--workload",
        type=str,
        default=None,
        choices=WORKLOAD_PROFILES,
        help="drive the scheduler in-process with this profile (no HTTP needed)",
    )
    twin.add_argument(
        "--concurrency",
        type=_positive_int,
        default=None,
        help="requests the built-in workload keeps in flight",
    )
    twin.add_argument(
        "--answer-tokens",
        type=_positive_int,
        default=None,
        help="mean answer length when a request does not set ignore_eos (default: the preset's)",
    )
    twin.add_argument(
        "--sim-step-time-factor",
        type=_positive_float,
        default=1.0,
        help="multiply every batch's duration (0.9 = 11%% faster hardware); benchmarks of the "
        "improve-or-revert gate use it to create a known true effect",
    )
    twin.add_argument(
        "--sim-gpu-gib",
        type=_positive_float,
        default=None,
        help="override the preset's GPU memory (GiB): both what SGLang's defaults see as the "
        "total and the free memory before the weights load",
    )
    twin.add_argument(
        "--sim-weights-gib",
        type=float,
        default=None,
        help="override the preset's weights per GPU (GiB)",
    )
    twin.add_argument(
        "--sim-other-static-gib",
        type=float,
        default=None,
        help="override the preset's other static GPU memory (GiB)",
    )
    return p


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
    chunked_prefill_size: int  # -1 disables chunking
    attention_tp: int
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


def resolve(argv: list[str], prog: str = "launch_server.py") -> TwinConfig:
    """Parse and resolve like SGLang's ServerArgs.__post_init__; argparse exits 2 on bad input.

    When the memory arithmetic refuses the configuration the result carries it in `failure`;
    the server then fails the way SGLang does, after loading the weights.
    """
    parser = build_parser(prog)
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
    preset = _replace_preset_memory(get_preset(ns.preset), ns)
    if ns.sim_step_time_factor != 1.0:
        f = ns.sim_step_time_factor
        st = preset.step
        preset = replace(
            preset,
            step=replace(
                st,
                decode_base_s=st.decode_base_s * f,
                mem_bw_bytes_per_s=st.mem_bw_bytes_per_s / f,
                per_seq_s=st.per_seq_s * f,
                prefill_base_s=st.prefill_base_s * f,
                prefill_tokens_per_s=st.prefill_tokens_per_s / f,
                host_link_bytes_per_s=st.host_link_bytes_per_s / f,
                hicache_decode_overhead_s=st.hicache_decode_overhead_s * f,
            ),
        )
    if ns.disable_cuda_graph:
        preset = replace(preset, memory=replace(preset.memory, graph_gib=0.0))
    model = preset.model
    tp = ns.tp_size if ns.tp_size is not None else preset.tp_size
    dp = ns.dp_size
    if ns.enable_dp_attention and tp % dp != 0:
        parser.error(
            f"tp_size ({tp}) must be divisible by dp_size ({dp}) with --enable-dp-attention"
        )
    gpus = tp * ns.pp_size * (1 if ns.enable_dp_attention else dp)
    if gpus > preset.gpus_per_host * ns.nnodes:
        parser.error(
            f"the preset {preset.name} has {preset.gpus_per_host} GPUs per node; "
            f"tp*pp*dp = {gpus} does not fit"
        )
    attention_tp = tp // dp if ns.enable_dp_attention else tp
    defaults = gpu_defaults(version, preset.memory.gpu_memory_mib, tp)
    chunked = (
        ns.chunked_prefill_size
        if ns.chunked_prefill_size is not None
        else (defaults.chunked_prefill_size)
    )
    if chunked == 0 or chunked < -1:
        parser.error(f"argument --chunked-prefill-size: must be -1 (off) or > 0, got {chunked}")
    if chunked > 0 and chunked % (ns.page_size or 1):
        # SGLang asserts this before starting (arg_groups/validation_hook.py check_server_args).
        parser.error("chunked_prefill_size must be divisible by page_size")
    graph_bs = ns.cuda_graph_max_bs or defaults.cuda_graph_max_bs
    if ns.mem_fraction_static is not None:
        mfs = ns.mem_fraction_static
    else:
        mfs = default_mem_fraction_static(
            version,
            preset.memory.gpu_memory_mib,
            tp,
            ns.pp_size,
            chunked,
            graph_bs,
            model.is_mla,
            model.multimodal,
            cuda_graphs=not ns.disable_cuda_graph,
        )
    page_size = ns.page_size or 1
    context_len = ns.context_length or model.context_length
    kv_dtype = model.resolve_kv_dtype(ns.kv_cache_dtype)
    if kv_dtype not in KV_DTYPE_BYTES:
        parser.error(f"argument --kv-cache-dtype: {kv_dtype!r} is not supported by the twin")
    failure: StartupFailure | None = None
    try:
        capacity = plan_capacity(
            preset, version, mfs, kv_dtype, attention_tp, page_size, ns.max_total_tokens
        )
    except StartupFailure as exc:
        failure = exc
        capacity = Capacity(
            0.0, 0.0, 0.0, preset.model.cell_size(kv_dtype, attention_tp), 0, 0, 0.0, ()
        )
    max_running = effective_max_running_requests(
        max(2, capacity.max_total_num_tokens), context_len, ns.max_running_requests, dp
    )
    served = ns.served_model_name or ns.model_path or model.name
    server_args: dict[str, Any] = {
        "model_path": ns.model_path or model.name,
        "tokenizer_path": ns.tokenizer_path or ns.model_path or model.name,
        "served_model_name": served,
        "host": ns.host,
        "port": ns.port,
        "tp_size": tp,
        "dp_size": dp,
        "pp_size": ns.pp_size,
        "ep_size": ns.ep_size,
        "nnodes": ns.nnodes,
        "enable_dp_attention": ns.enable_dp_attention,
        "mem_fraction_static": mfs,
        "max_total_tokens": ns.max_total_tokens,
        "max_running_requests": ns.max_running_requests,
        "max_queued_requests": ns.max_queued_requests,
        "chunked_prefill_size": chunked,
        "max_prefill_tokens": ns.max_prefill_tokens,
        "page_size": page_size,
        "kv_cache_dtype": ns.kv_cache_dtype,
        "context_length": ns.context_length,
        "schedule_policy": ns.schedule_policy,
        "schedule_conservativeness": ns.schedule_conservativeness,
        "disable_radix_cache": ns.disable_radix_cache,
        "enable_hierarchical_cache": ns.enable_hierarchical_cache,
        "hicache_ratio": ns.hicache_ratio
        if ns.hicache_ratio is not None
        else (None if version.refactored else 2.0),
        "hicache_size": ns.hicache_size,
        "hicache_write_policy": ns.hicache_write_policy,
        "hicache_io_backend": ns.hicache_io_backend,
        "hicache_mem_layout": ns.hicache_mem_layout
        or ("page_first" if version.refactored else "layer_first"),
        "hicache_storage_backend": ns.hicache_storage_backend,
        "cuda_graph_max_bs": graph_bs,
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
    }
    return TwinConfig(
        server_args=server_args,
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
        page_size=page_size,
        chunked_prefill_size=chunked,
        attention_tp=attention_tp,
        launch_command=list(argv),
        failure=failure,
    )
