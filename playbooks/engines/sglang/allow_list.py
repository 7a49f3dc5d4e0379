"""The SGLang server arguments kvpilot may reason about or change, with validation.

One allow-list serves `diagnose --consider`, proposals and the launchers: a key outside it is
refused, and every value is parsed and range-checked here, never passed through as text.

Each value is held as the Python type SGLang's argparse declares for the flag and spelt back the
way that type parses it: SGLang exits at start-up on `--hicache-size 40.0` (`type=int`), so an
int flag is never spelt with a decimal point. The types, choices and checks below are those of
SGLang 0.5.23, whose flags are generated from annotated fields in
`sglang/srt/arg_groups/fields/*.py` by `arg_utils.add_cli_args_from_dataclass` (`int` ->
`type=int`, `float` -> `type=float`, `bool` -> `store_true`, `Arg(choices=...)` -> `choices`,
`Arg(type_parser=human_readable_int)` -> that parser, which also takes plain integers). Where
kvpilot is stricter than SGLang the reason is given next to the range;
`tests/real_sglang/test_real_arg_parser.py` checks all of it against the real parser.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from playbooks.engines.base import ArgError, ArgReading
from playbooks.engines.launch_args import (
    AllowList,
    ArgSpec,
    BoolValue,
    ChoiceValue,
    Default,
    FloatValue,
    IntValue,
    normalise_key,
    read,
    value_of,
    when_absent,
    without,
)

# The value types live in the engine-neutral module; they are named here too, where the
# allow-list's users have always found them.
__all__ = [
    "ALLOWED",
    "ArgSpec",
    "BoolValue",
    "ChoiceValue",
    "FloatValue",
    "IntValue",
    "arg_value",
    "normalise_key",
    "parse_assignment",
    "parse_change",
    "read_arg",
    "spec_of",
    "with_change",
]

# fields/model.py `kv_cache_dtype: A[str, Arg(choices=[...])] = "auto"`. 0.5.23 offers auto,
# fp8_e5m2, fp8_e4m3, mxfp8, bf16, bfloat16, nvfp4, fp4_mx_block16; 0.5.5 offers fp4_e2m1 in
# place of the mxfp8/nvfp4/fp4_mx_block16 trio. kvpilot keeps the choices both versions share
# that a Hopper-class GPU can run: mxfp8 and nvfp4 need Blackwell (SM100+; kv_cache_hook.py
# refuses them elsewhere), and kvpilot's capacity arithmetic knows 1- and 2-byte elements only.
KV_DTYPES = ("auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2")
# fields/memory.py `hicache_write_policy: A[str, Arg(choices=[...])] = "write_through"`.
WRITE_POLICIES = ("write_through", "write_back", "write_through_selective")

# Token and request counts: SGLang keeps token slots in int32 tensors (mem_cache/memory_pool.py
# `req_to_token ... dtype=torch.int32`), so a count that does not fit one is never meaningful.
INT32_MAX = 2**31 - 1
# chunked_prefill_size must be a multiple of page_size (arg_groups/validation_hook.py
# `check_server_args`: "chunked_prefill_size must be divisible by page_size"). The chunk sizes
# SGLang picks by itself are powers of two from 2048 (memory_hook.py
# `handle_gpu_memory_settings`), so a power-of-two page size up to this always divides them.
PAGE_SIZE_MAX = 2048


# Sources are SGLang 0.5.23 `sglang/srt/arg_groups/fields/<file>.py`, the field of the same name.
ALLOWED: dict[str, ArgSpec] = {
    spec.name: spec
    for spec in (
        # schedule.py `mem_fraction_static: A[Optional[float], ...] = None` (no range check).
        # kvpilot: a share of GPU memory, (0, 1); SGLang only finds out after loading weights.
        ArgSpec(
            "mem_fraction_static",
            FloatValue(0.0, 1.0),
            "share of GPU memory for weights and KV cache",
        ),
        ArgSpec("kv_cache_dtype", ChoiceValue(KV_DTYPES), "KV cache element type"),
        # schedule.py `max_total_tokens: A[Optional[int], Arg(type_parser=human_readable_int)]`.
        ArgSpec(
            "max_total_tokens",
            IntValue(1, INT32_MAX, unit="tokens"),
            "cap on the KV pool in tokens",
        ),
        # schedule.py `max_running_requests: A[Optional[int], ...] = None`.
        ArgSpec(
            "max_running_requests",
            IntValue(1, INT32_MAX, unit="requests"),
            "cap on concurrently running requests",
        ),
        # schedule.py `chunked_prefill_size: A[Optional[int], ...] = None`; "-1 means disabling
        # chunked prefill" (the scheduler treats any value <= 0 so; kvpilot keeps the one spelling).
        ArgSpec(
            "chunked_prefill_size",
            IntValue(1, INT32_MAX, allow=(-1,), unit="tokens"),
            "prefill chunk in tokens (-1 disables chunking)",
        ),
        # schedule.py `max_prefill_tokens: A[int, Arg(type_parser=human_readable_int)] = 16384`.
        ArgSpec(
            "max_prefill_tokens",
            IntValue(1, INT32_MAX, unit="tokens"),
            "tokens per prefill batch",
        ),
        # schedule.py `schedule_conservativeness: A[float, ...] = 1.0`; validation_hook.py
        # asserts it is non-negative. kvpilot: (0, 10], 0 would admit without any reserve.
        ArgSpec(
            "schedule_conservativeness",
            FloatValue(0.0, 10.0, hi_open=False),
            "how cautiously new requests are admitted",
        ),
        # memory.py `enable_hierarchical_cache: A[bool, Arg(aliases=["--enable-hicache"])]`.
        ArgSpec(
            "enable_hierarchical_cache",
            BoolValue(),
            "host-RAM tier for the prefix cache",
            aliases=("--enable-hicache",),
        ),
        # memory.py `hicache_ratio: A[Optional[float], ...] = None`.
        ArgSpec(
            "hicache_ratio",
            FloatValue(0.0, 100.0),
            "host pool size relative to the GPU pool",
        ),
        # memory.py `hicache_size: A[int, "... in gigabytes ..."] = 0`: a whole number of GB.
        ArgSpec(
            "hicache_size",
            IntValue(0, 10_000, unit="GB"),
            "host pool size in GB per rank (0 = use the ratio)",
        ),
        ArgSpec(
            "hicache_write_policy",
            ChoiceValue(WRITE_POLICIES),
            "when KV is copied to host",
        ),
        # schedule.py `schedule_policy: A[str, Arg(choices=[...])] = "fcfs"`. kvpilot offers
        # the longest-prefix-match order for prefix-heavy work and the default to go back.
        ArgSpec(
            "schedule_policy",
            ChoiceValue(("fcfs", "lpm")),
            "the order waiting requests are admitted in",
        ),
        # exec_.py `cuda_graph_max_bs_decode: A[Optional[int], ...] = None` (0.5.23; earlier
        # releases spell it --cuda-graph-max-bs). kvpilot: up to 4096, the largest batch its
        # proposals cover.
        ArgSpec(
            "cuda_graph_max_bs_decode",
            IntValue(1, 4096, unit="requests"),
            "largest decode batch captured as a CUDA graph",
        ),
        # parallel.py `attn_dp_size: int = 1` (0.5.23; `--enable-dp-attention --dp-size N` is
        # the deprecated spelling it folds in). parallel_hook.py asserts tp_size % attn_dp_size
        # == 0, which kvpilot checks against the server's TP size before a restart.
        # `Arg(aliases=["--attention-data-parallel-size"])`.
        ArgSpec(
            "attn_dp_size",
            IntValue(1, 1024, unit="ranks"),
            "attention data-parallel ranks (a divisor of the TP size)",
            aliases=("--attention-data-parallel-size",),
        ),
        # schedule.py `page_size: A[Optional[int], Arg(resolvable=True)] = None` (None -> 1);
        # a power of two up to PAGE_SIZE_MAX so that it divides SGLang's own chunk sizes.
        ArgSpec(
            "page_size",
            IntValue(1, PAGE_SIZE_MAX, unit="tokens", power_of_two=True),
            "KV page size in tokens",
        ),
    )
}


TABLE = AllowList(ALLOWED, "a server argument", "mem_fraction_static=0.9")
spec_of = TABLE.spec_of
# `KEY=VALUE` (`mem_fraction_static=0.9` or `--mem-fraction-static=0.9`)
parse_assignment = TABLE.parse_assignment


def check_page_divides_chunk(page_size: object, chunked_prefill_size: object) -> None:
    """SGLang refuses to start when a positive chunk is not a multiple of the page size
    (arg_groups/validation_hook.py `check_server_args`)."""
    if not isinstance(page_size, int) or not isinstance(chunked_prefill_size, int):
        return
    if page_size > 0 and chunked_prefill_size > 0 and chunked_prefill_size % page_size:
        raise ArgError(
            f"chunked_prefill_size ({chunked_prefill_size}) must be a multiple of page_size "
            f"({page_size}); SGLang refuses to start otherwise"
        )


def parse_change(items: Sequence[str]) -> dict[str, Any]:
    change = TABLE.parse_items(items)
    check_page_divides_chunk(change.get("page_size"), change.get("chunked_prefill_size"))
    if change.get("hicache_size") or change.get("hicache_ratio"):
        change.setdefault("enable_hierarchical_cache", True)
    return change


# ----------------------------------------------------------------------------- command lines
def with_change(args: Sequence[str], change: Mapping[str, Any]) -> list[str]:
    """Apply allowed changes to an SGLang argument list (never a shell string).

    Existing `--flag value` / `--flag=value` / bare `--flag` entries for a changed key are removed,
    then the new value is appended, checked and spelt as SGLang's argparse type reads it (an int
    flag never gets `40.0`, which SGLang refuses); `False` removes a boolean flag, `None` any flag.
    """
    out = list(args)
    for key, value in change.items():
        spec = spec_of(key)
        out = without(out, spec.spellings)
        if value is not None:
            out += spec.cli(value)
    if {"page_size", "chunked_prefill_size"} & {normalise_key(k) for k in change}:
        check_page_divides_chunk(
            _int_or_none(arg_value(out, "page_size")),
            _int_or_none(arg_value(out, "chunked_prefill_size")),
        )
    return out


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def arg_value(args: Sequence[str], name: str) -> str | None:
    """The value of `--name` (or an alias) in an argument list (a bare flag as "true")."""
    key = normalise_key(name)
    spec = ALLOWED.get(key)
    return value_of(args, spec.spellings if spec else ("--" + key.replace("_", "-"),))


# ----------------------------------------------------------------------------- defaults
# What SGLang 0.5.23 runs when a flag is absent, where that is a constant of its own: the
# field's declared default in `sglang/srt/arg_groups/fields/<file>.py` (a `bool` field is a
# store_true flag, off when absent). Read by `read_arg`, so that `--schedule-policy fcfs` on a
# server without the flag is no change.
DEFAULTS: dict[str, Default] = {
    "kv_cache_dtype": Default(
        'sglang/srt/arg_groups/fields/model.py `kv_cache_dtype = "auto"` (its start-up passes '
        "read an explicit `auto` as they read the default: arg_groups/overrides.py)",
        "auto",
    ),
    "max_total_tokens": Default(
        "sglang/srt/arg_groups/fields/schedule.py `max_total_tokens = None`: no cap", None
    ),
    "max_prefill_tokens": Default(
        "sglang/srt/arg_groups/fields/schedule.py `max_prefill_tokens = 16384`", 16384
    ),
    "schedule_conservativeness": Default(
        "sglang/srt/arg_groups/fields/schedule.py `schedule_conservativeness = 1.0`", 1.0
    ),
    "schedule_policy": Default(
        'sglang/srt/arg_groups/fields/schedule.py `schedule_policy = "fcfs"`', "fcfs"
    ),
    "enable_hierarchical_cache": Default(
        "sglang/srt/arg_groups/fields/memory.py `enable_hierarchical_cache: bool = False` "
        "(a store_true flag)",
        False,
    ),
    "hicache_size": Default("sglang/srt/arg_groups/fields/memory.py `hicache_size = 0`", 0),
    "hicache_write_policy": Default(
        'sglang/srt/arg_groups/fields/memory.py `hicache_write_policy = "write_through"`',
        "write_through",
    ),
}
# Absent flags whose value SGLang works out at start-up from what kvpilot cannot know: a change
# to any value of them is a real change (the server may have picked another).
AT_START: dict[str, str] = {
    "mem_fraction_static": "SGLang picks it from the GPU's memory at start-up "
    "(arg_groups/memory_hook.py `handle_gpu_memory_settings`)",
    "chunked_prefill_size": "SGLang picks it from the GPU's memory at start-up "
    "(arg_groups/memory_hook.py `handle_gpu_memory_settings`)",
    "cuda_graph_max_bs_decode": "SGLang picks it from the GPU's memory at start-up "
    "(arg_groups/memory_hook.py `handle_gpu_memory_settings`)",
    "max_running_requests": "SGLang derives it from the KV pool at start-up",
    "hicache_ratio": "SGLang's default depends on the host memory mode (fields/memory.py "
    "`hicache_ratio = None`: 2.0 in cache mode, 1.2 in buffer_only mode)",
    "page_size": "SGLang's attention backend picks it at start-up (fields/schedule.py "
    "`page_size = None`, resolvable)",
    "attn_dp_size": "SGLang resolves it at start-up, also from the deprecated "
    "`--enable-dp-attention --dp-size N` (fields/parallel.py)",
}
ABSENT = when_absent(DEFAULTS, AT_START, "SGLang")
# One value, two spellings: mem_cache/kv_cache_dtype.py `configure_kv_cache_dtype` reads
# `bf16` and `bfloat16` as the same torch.bfloat16.
SYNONYMS: dict[str, dict[Any, Any]] = {"kv_cache_dtype": {"bf16": "bfloat16"}}


def read_arg(args: Sequence[str], name: str) -> ArgReading:
    """An allowed argument as SGLang would run it from `args` (`base.ArgReading`)."""
    spec = spec_of(name)
    return read(spec, args, ABSENT(spec.name), synonyms=SYNONYMS.get(spec.name))
