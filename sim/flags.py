"""The twin's command-line flags as a table: SGLang's own, then the twin's.

SGLang flags keep SGLang's names, types, choices and defaults (SGLang 0.5.23's argparse types,
down to the type functions' names, which argparse prints in its errors), so a launcher builds
the same command line for the twin and for a real server. A table rather than a long run of
``add_argument`` calls, so that each flag reads as one line of data.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sim.presets import DEFAULT_PRESET, PRESETS
from sim.version import DEFAULT_VERSION

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
# The twin's hidden activation peak: a flag, or the environment for a launcher whose command
# line kvpilot can read. Neither is echoed anywhere the server reports.
PEAK_SCALE_FLAG = "--sim-activation-peak-scale"
PEAK_SCALE_ENV = "SIM_ACTIVATION_PEAK_SCALE"
HIDDEN_FLAGS = frozenset({PEAK_SCALE_FLAG})


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


@dataclass(frozen=True)
class Flag:
    """One ``add_argument`` call: the option strings and argparse's keyword options."""

    names: tuple[str, ...]
    options: Mapping[str, Any]


def flag(*names: str, **options: Any) -> Flag:
    return Flag(names, options)


# Names and defaults as in SGLang's ServerArgs. The flags kvpilot may change carry SGLang
# 0.5.23's argparse types exactly (sglang/srt/arg_groups/fields/schedule.py and memory.py, same
# field names); the twin's range checks on them run after parsing (`sim.args`).
SGLANG_FLAGS: tuple[Flag, ...] = (
    flag("--model-path", "--model", dest="model_path", type=str, default=None),
    flag("--tokenizer-path", type=str, default=None),
    flag("--served-model-name", type=str, default=None),
    flag("--host", type=str, default="127.0.0.1"),
    flag("--port", type=int, default=30000),
    flag("--tp-size", "--tensor-parallel-size", dest="tp_size", type=_positive_int, default=None),
    flag("--dp-size", "--data-parallel-size", dest="dp_size", type=_positive_int, default=1),
    flag("--pp-size", "--pipeline-parallel-size", dest="pp_size", type=_positive_int, default=1),
    flag("--ep-size", "--expert-parallel-size", dest="ep_size", type=_positive_int, default=1),
    flag("--nnodes", type=_positive_int, default=1),
    flag("--enable-dp-attention", action="store_true"),
    flag(
        "--attn-dp-size",
        "--attention-data-parallel-size",
        dest="attn_dp_size",
        type=int,  # fields/parallel.py: a plain int; parallel_hook.py's assertions refuse < 1
        default=1,
    ),
    flag(
        "--load-balance-method",
        type=str,
        default="auto",
        choices=["auto", "round_robin", "follow_bootstrap_room", "total_requests", "total_tokens"],
    ),
    flag("--speculative-algorithm", type=str, default=None),
    flag(
        "--speculative-draft-model-path",
        "--speculative-draft-model",
        dest="speculative_draft_model_path",
        type=str,
        default=None,
    ),
    flag("--speculative-num-steps", type=_positive_int, default=None),
    flag("--speculative-eagle-topk", type=_positive_int, default=None),
    flag("--speculative-num-draft-tokens", type=_positive_int, default=None),
    flag("--swa-full-tokens-ratio", type=float, default=None),
    flag("--enable-priority-scheduling", action="store_true"),
    flag("--default-priority-value", type=int, default=None),
    flag("--enable-metrics-for-all-schedulers", action="store_true"),
    flag("--mem-fraction-static", type=float, default=None),
    flag("--max-total-tokens", type=human_readable_int, default=None),
    flag("--max-running-requests", type=int, default=None),
    flag("--max-queued-requests", type=_positive_int, default=None),
    flag("--chunked-prefill-size", type=int, default=None),
    flag("--max-prefill-tokens", type=human_readable_int, default=16384),
    flag("--page-size", type=int, default=None),
    flag("--kv-cache-dtype", type=str, default="auto"),
    flag("--context-length", type=_positive_int, default=None),
    flag(
        "--schedule-policy",
        type=str,
        default="fcfs",
        # fields/schedule.py (0.5.23); the twin schedules first come, first served whatever it is
        choices=[
            "lpm",
            "random",
            "fcfs",
            "dfs-weight",
            "lof",
            "priority",
            "routing-key",
            "hrrn",
            "shortest-prefill-first",
        ],
    ),
    flag("--schedule-conservativeness", type=float, default=1.0),
    flag("--disable-radix-cache", action="store_true"),
    flag(
        "--enable-hierarchical-cache",
        "--enable-hicache",
        dest="enable_hierarchical_cache",
        action="store_true",
    ),
    flag("--hicache-ratio", type=float, default=None),
    flag("--hicache-size", type=int, default=0),  # GB
    flag("--hicache-write-policy", type=str, default="write_through", choices=WRITE_POLICIES),
    flag(
        "--hicache-io-backend",
        type=str,
        default="kernel",
        choices=["direct", "kernel", "kernel_ascend"],
    ),
    flag("--hicache-mem-layout", type=str, default=None),
    flag("--hicache-storage-backend", type=str, default=None),
    flag("--cuda-graph-max-bs", type=_positive_int, default=None),
    # fields/exec_.py (0.5.23) `cuda_graph_max_bs_decode: Optional[int] = None`
    flag("--cuda-graph-max-bs-decode", type=int, default=None),
    flag("--disable-cuda-graph", action="store_true"),
    flag("--enable-metrics", action="store_true"),
    flag("--decode-log-interval", type=_positive_int, default=40),
    flag("--stream-interval", type=_positive_int, default=1),
    flag("--api-key", type=str, default=None),
    flag("--log-level", type=str, default="info"),
    flag("--skip-server-warmup", action="store_true"),
    flag("--trust-remote-code", action="store_true"),
    flag("--enable-cache-report", action="store_true"),
    flag("--random-seed", type=int, default=None),
    flag(
        "--device",
        type=str,
        default="cuda",
        help="cuda for a GPU server; cpu only changes the labels SGLang prints",
    ),
)

TWIN_FLAGS: tuple[Flag, ...] = (
    flag("--preset", type=str, default=DEFAULT_PRESET, choices=sorted(PRESETS)),
    flag("--sglang-version", type=str, default=DEFAULT_VERSION),
    flag(
        "--time-scale",
        type=_positive_float,
        default=1.0,
        help="the simulated world runs K times faster than the wall clock",
    ),
    flag(
        "--host-ram-gb",
        type=_positive_float,
        default=None,
        help="host RAM in GiB (default: the preset's)",
    ),
    flag("--seed", type=int, default=0),
    flag(
        "--workload",
        type=str,
        default=None,
        choices=WORKLOAD_PROFILES,
        help="drive the scheduler in-process with this profile (no HTTP needed)",
    ),
    flag(
        "--concurrency",
        type=_positive_int,
        default=None,
        help="requests the built-in workload keeps in flight",
    ),
    flag(
        "--answer-tokens",
        type=_positive_int,
        default=None,
        help="mean answer length when a request does not set ignore_eos (default: the preset's)",
    ),
    flag(
        "--sim-spec-accept-length",
        type=_positive_float,
        default=None,
        help="the accept length sglang:spec_accept_length reports with speculation on "
        "(default 2.5, an assumed value; the twin's decode steps still emit one token)",
    ),
    flag(
        "--sim-step-time-factor",
        type=_positive_float,
        default=1.0,
        help="multiply every batch's duration (0.9 = 11%% faster hardware); benchmarks of the "
        "improve-or-revert gate use it to create a known true effect",
    ),
    flag(  # hidden: for tests of kvpilot's answer quality check, not for people
        "--sim-fp8-answer-drift",
        type=float,
        default=0.0,
        help=argparse.SUPPRESS,  # share of greedy answers that differ with an 8-bit KV cache
    ),
    flag(
        PEAK_SCALE_FLAG,
        type=_positive_float,
        default=None,
        help="the true activation peak relative to the modelled one (default 1, or "
        f"${PEAK_SCALE_ENV}): a batch whose true peak does not fit kills the server with "
        "CUDA's out-of-memory error. Hidden: not in server info, metrics or logs",
    ),
    flag(
        "--sim-startup-s",
        type=_positive_float,
        default=None,
        help="simulated seconds the weights and CUDA graphs take to load (default: the "
        "preset's; a host pool adds its pinning): a model read from slow storage",
    ),
    flag(
        "--sim-gpu-gib",
        type=_positive_float,
        default=None,
        help="override the preset's GPU memory (GiB): both what SGLang's defaults see as the "
        "total and the free memory before the weights load",
    ),
    flag(
        "--sim-weights-gib",
        type=float,
        default=None,
        help="override the preset's weights per GPU (GiB)",
    ),
    flag(
        "--sim-other-static-gib",
        type=float,
        default=None,
        help="override the preset's other static GPU memory (GiB)",
    ),
)


def build_parser(prog: str = "launch_server.py") -> argparse.ArgumentParser:
    """The parser of SGLang's flags and, in their own help group, the twin's."""
    parser = argparse.ArgumentParser(prog=prog, allow_abbrev=False)
    for spec in SGLANG_FLAGS:
        parser.add_argument(*spec.names, **spec.options)
    twin = parser.add_argument_group("twin-only (not SGLang flags)")
    for spec in TWIN_FLAGS:
        twin.add_argument(*spec.names, **spec.options)
    return parser
