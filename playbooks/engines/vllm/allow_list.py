"""The vLLM launch arguments kvpilot may reason about or change, with validation.

One allow-list serves `diagnose --consider`, proposals and the launchers: a key outside it is
refused, and every value is parsed and range-checked here, never passed through as text.

vLLM builds its flags from typed config dataclasses (`vllm/engine/arg_utils.py`,
`_compute_kwargs`: `bool` -> `argparse.BooleanOptionalAction`, so each on/off flag also has a
`--no-` form; `Literal[...]` -> `choices`; `int` -> `type=int`, or `human_readable_int` for the
token and byte counts listed there; `float` -> `type=float`), and pydantic checks the ranges
(`Field(gt=..., ge=..., le=...)`) when the config is built, where a refusal is a
`ValidationError` and exit status 1 rather than argparse's 2. The types, choices and ranges below
are those of vLLM 0.32 (`vllm/config/cache.py`, `scheduler.py`, `model.py`, `compilation.py`);
where kvpilot is stricter the reason is next to the entry. vLLM's parser
(`FlexibleArgumentParser`) also reads `--max_num_seqs` for `--max-num-seqs`, so edits find and
remove both spellings, and every alias of a flag.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from playbooks.engines import launch_args as la
from playbooks.engines.base import ArgError, ArgReading

# Token, request and byte counts: vLLM keeps block tables and token positions in int32 tensors,
# so a count beyond one is never meaningful (kvpilot's bound; vLLM sets none).
INT32_MAX = 2**31 - 1
GIB = 1 << 30
# `human_readable_int` (vllm/utils/argparse_utils.py:29-73): k/m/g/t are decimal, K/M/G/T binary
# (and take no decimals); a plain integer is read as is.
_HUMAN = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
AUTO = -1  # `--max-model-len auto` (or -1): the longest length that fits the KV cache


def human_readable_int(text: str) -> int:
    """vLLM's own reading of `4k`, `64M`, `1.5g` (utils/argparse_utils.py `human_readable_int`)."""
    text = text.strip()
    match = _HUMAN.fullmatch(text)
    if match is None:
        try:
            return int(text)
        except ValueError:
            raise ArgError(f"expected a whole number (or 4k, 64M, 1.5g), got {text!r}") from None
    number, suffix = match.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    if "." in number:
        raise ArgError(
            f"decimals are not allowed with the binary suffix {suffix} (vLLM refuses "
            f"{text!r}); use {number}{suffix.lower()} for decimal units"
        )
    return int(number) * _BINARY[suffix]


@dataclass(frozen=True)
class HumanInt(la.IntValue):
    """A `human_readable_int` flag: held as int, read from `4k`/`64M` too, spelt as digits."""

    auto: bool = False  # `human_readable_int_or_auto`: `auto` and -1 mean AUTO

    def parse(self, text: str) -> int:
        if self.auto and text.strip().lower() in ("auto", "-1"):
            return AUTO
        return self.check(human_readable_int(text))

    def spell(self, value: int) -> str:
        return "auto" if self.auto and value == AUTO else str(value)


@dataclass(frozen=True)
class IntChoice(la.IntValue):
    """An int flag kvpilot allows only a few values of."""

    options: tuple[int, ...] = ()

    def check(self, raw: object) -> int:
        value = super().check(raw)
        if value not in self.options:
            allowed = ", ".join(map(str, self.options))
            raise ArgError(f"must be one of {allowed}, got {value}")
        return value


# config/cache.py:39-59 `CacheDType` (the argparse choices). kvpilot keeps the per-tensor
# 1- and 2-byte element types a Hopper-class GPU runs and its capacity arithmetic knows:
# `fp8` is `fp8_e4m3` on CUDA; fp8_inc is Gaudi's, fp8_ds_mla and nvfp4_ds_mla DeepSeek's
# sparse-MLA packing, nvfp4 needs Blackwell, and the turboquant, int4/int8/fp8 per-token-head
# layouts pack scales beside the cache, which the byte arithmetic here does not model.
KV_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
FP8_DTYPES = frozenset({"fp8", "fp8_e4m3", "fp8_e5m2"})
# config/cache.py `KVOffloadingBackend = Literal["native", "lmcache"]`.
OFFLOADING_BACKENDS = ("native", "lmcache")
# config/cache.py:75 `block_size: int = Field(default=None, gt=0)`: any positive int parses,
# but the engine then refuses a size its attention backend does not take (v1/worker/utils.py
# `select_common_block_size`; recorded: 7 fails with "No common block size for 7 (CPU_ATTN:
# [MultipleOf(32)])"): FlashAttention takes multiples of 16, the CPU backend multiples of 32.
# Releases before the field became free-form offered the choices 1, 8, 16, 32, 64, 128. kvpilot
# allows the powers of two from 16 to 128 (16 is the GPU default, 128 the CPU one).
BLOCK_SIZES = (16, 32, 64, 128)

ALLOWED: dict[str, la.ArgSpec] = {
    spec.name: spec
    for spec in (
        # config/cache.py:102 `gpu_memory_utilization: float = Field(default=0.92, gt=0, le=1)`;
        # arg_utils.py:1356-1361 adds the alias --device-memory-utilization (same dest).
        la.ArgSpec(
            "gpu_memory_utilization",
            la.FloatValue(0.0, 1.0, hi_open=False),
            "share of the GPU's total memory the whole instance may use (weights, activations, "
            "CUDA graphs and KV cache)",
            aliases=("--device-memory-utilization",),
        ),
        la.ArgSpec("kv_cache_dtype", la.ChoiceValue(KV_DTYPES), "KV cache element type"),
        # config/scheduler.py:62 `max_num_seqs: int = Field(..., ge=1)`; type=int.
        la.ArgSpec(
            "max_num_seqs",
            la.IntValue(1, INT32_MAX, unit="requests"),
            "cap on requests running at once",
        ),
        # config/scheduler.py:48 `max_num_batched_tokens: int = Field(..., ge=1)`;
        # arg_utils.py:391-403 reads it with human_readable_int.
        la.ArgSpec(
            "max_num_batched_tokens",
            HumanInt(1, INT32_MAX, unit="tokens"),
            "tokens one engine step may schedule (decodes and prefill chunks together)",
        ),
        la.ArgSpec(
            "block_size",
            IntChoice(1, INT32_MAX, unit="tokens", options=BLOCK_SIZES),
            "KV block (page) size in tokens",
        ),
        # config/model.py:245 `max_model_len: int = Field(default=None, ge=-1)`; read with
        # human_readable_int_or_auto (arg_utils.py:397-400; `auto`/-1: fit to the KV cache).
        la.ArgSpec(
            "max_model_len",
            HumanInt(1, INT32_MAX, allow=(AUTO,), unit="tokens", auto=True),
            "longest request (prompt and output) in tokens; auto fits it to the KV cache",
        ),
        # config/cache.py `enable_prefix_caching: bool = True`; the flag's default is None
        # (arg_utils.py:1369-1375), resolved from the model's support.
        la.ArgSpec(
            "enable_prefix_caching",
            la.BoolValue(negatable=True),
            "automatic prefix caching",
        ),
        # config/model.py:272 `enforce_eager: bool = False` (0.32: no torch.compile either).
        la.ArgSpec(
            "enforce_eager",
            la.BoolValue(negatable=True),
            "run eagerly: no CUDA graphs, no torch.compile",
        ),
        # config/compilation.py:695 `max_cudagraph_capture_size: int = None`; type=int, no
        # range. kvpilot: up to 4096, the largest decode batch its proposals cover.
        la.ArgSpec(
            "max_cudagraph_capture_size",
            la.IntValue(1, 4096, unit="requests"),
            "largest decode batch captured as a CUDA graph",
        ),
        # config/cache.py `kv_offloading_size: float | None = None` (GiB, the total over TP
        # ranks); type=float. kvpilot: a positive size up to 4 TiB of host memory.
        la.ArgSpec(
            "kv_offloading_size",
            la.FloatValue(0.0, 4096.0, hi_open=False),
            "host (CPU) memory for offloaded KV blocks, GiB over all TP ranks",
        ),
        la.ArgSpec(
            "kv_offloading_backend",
            la.ChoiceValue(OFFLOADING_BACKENDS),
            "where offloaded KV blocks go (vLLM's own CPU tier, or LMCache)",
        ),
        # config/cache.py `kv_cache_memory_bytes: int | None = None` (per GPU); read with
        # human_readable_int. kvpilot: at least 1 MiB, at most 16 TiB.
        la.ArgSpec(
            "kv_cache_memory_bytes",
            HumanInt(1 << 20, 1 << 44, unit="bytes"),
            "KV cache size per GPU in bytes; overrides gpu_memory_utilization's sizing",
        ),
    )
}
# An alias's name sets its argument too (`device_memory_utilization=0.9` is accepted).
TABLE = la.AllowList(ALLOWED, "a vLLM argument", "gpu_memory_utilization=0.95", by_alias=True)
spec_of = TABLE.spec_of
# `KEY=VALUE` (`gpu_memory_utilization=0.95` or `--max-num-seqs=512`)
parse_assignment = TABLE.parse_assignment


def check_budget_covers_seqs(seqs: object, tokens: object) -> None:
    """vLLM refuses a token budget below the running-request cap (config/scheduler.py:328
    "max_num_batched_tokens (X) must be greater than or equal to max_num_seqs (Y)")."""
    if isinstance(seqs, int) and isinstance(tokens, int) and tokens < seqs:
        raise ArgError(
            f"max_num_batched_tokens ({tokens}) must be at least max_num_seqs ({seqs}); "
            "vLLM refuses to start otherwise"
        )


def parse_change(items: Sequence[str]) -> dict[str, Any]:
    change = TABLE.parse_items(items)
    check_budget_covers_seqs(change.get("max_num_seqs"), change.get("max_num_batched_tokens"))
    return change


# ----------------------------------------------------------------------------- command lines
def with_change(args: Sequence[str], change: Mapping[str, Any]) -> list[str]:
    """Apply allowed changes to a vLLM argument list (never a shell string).

    Every spelling of a changed argument is removed first (`--flag value`, `--flag=value`, the
    underscore form, aliases, and `--flag`/`--no-flag` of an on/off flag, which take no value,
    so a positional model path after one stays put), then the new value is appended, checked and
    spelt as vLLM's parser reads it: ints as digits, `auto` for an automatic model length,
    `--no-FLAG` for off; `None` removes the argument, leaving vLLM's default.
    """
    out = list(args)
    for key, value in change.items():
        spec = spec_of(key)
        out = la.without(out, spec.spellings, takes_value=spec.takes_value, underscores=True)
        if spec.name in IN_COMPILATION_CONFIG:
            out = _without_in_compilation_config(out, spec.name)
        if value is not None:
            out += spec.cli(value)
    names = {la.normalise_key(k) for k in change}
    if {"max_num_seqs", "max_num_batched_tokens"} & names:
        check_budget_covers_seqs(
            _int_or_none(arg_value(out, "max_num_seqs")),
            _int_or_none(arg_value(out, "max_num_batched_tokens")),
        )
    return out


# Settings vLLM also reads inside the compilation config, given as JSON
# (`--compilation-config '{"max_cudagraph_capture_size": 256}'`, or `-cc`) or dotted
# (`-cc.max_cudagraph_capture_size=256`, merged into that JSON by FlexibleArgumentParser,
# vllm/utils/argparse_utils.py:425-458). vLLM refuses the flag and the nested key together:
# "max_cudagraph_capture_size and compilation_config.max_cudagraph_capture_size are mutually
# exclusive" (vllm/engine/arg_utils.py:2796-2801), so an edit of the flag takes the key out.
IN_COMPILATION_CONFIG = frozenset({"max_cudagraph_capture_size"})
COMPILATION_CONFIG_FLAGS = ("--compilation-config", "--compilation_config", "-cc")


def _without_in_compilation_config(args: Sequence[str], name: str) -> list[str]:
    """`args` without `name` in any compilation config: dotted spellings are dropped, a JSON
    value loses the key (the flag goes where nothing else is left). A value that is not a JSON
    object is left as it is: vLLM then reports what it makes of it."""
    dotted = {f"{flag}.{name}" for flag in COMPILATION_CONFIG_FLAGS}
    out: list[str] = []
    i = 0
    while i < len(args):
        tok = args[i]
        flag, eq, inline = tok.partition("=")
        if flag in dotted:
            i += 1 if eq else 2  # the value is inline or the next token
            continue
        if flag in COMPILATION_CONFIG_FLAGS:
            has_next = not eq and i + 1 < len(args)
            text = inline if eq else (args[i + 1] if has_next else "")
            step = 1 if eq or not has_next else 2
            kept = _json_without(text, name)
            if kept is None:
                out += args[i : i + step]
            elif kept:
                out += [f"{flag}={kept}"] if eq else [flag, kept]
            i += step
            continue
        out.append(tok)
        i += 1
    return out


def _json_without(text: str, name: str) -> str | None:
    """A JSON object without `name` ("" where nothing is left); None where `text` is not a JSON
    object holding `name` (nothing to change)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or name not in value:
        return None
    rest = {k: v for k, v in value.items() if k != name}
    return json.dumps(rest) if rest else ""


def _int_or_none(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return human_readable_int(text)
    except ArgError:
        return None


def arg_value(args: Sequence[str], name: str) -> str | None:
    """The value of an argument in an argument list, under any spelling vLLM reads (a later
    one wins); an on/off flag reads "true", or "false" where its `--no-` form came last."""
    spec = TABLE.find(name)
    if spec is None:
        key = la.normalise_key(name)
        return la.value_of(args, ("--" + key.replace("_", "-"),), underscores=True)
    negated = spec.negated
    if negated is not None:
        state: str | None = None
        for tok in args:
            if tok in (spec.flag, "--" + spec.name):
                state = "true"
            elif tok in (negated, "--no_" + spec.name, "--no-" + spec.name):
                state = "false"
        return state
    return la.value_of(args, (spec.flag, *spec.aliases), underscores=True)


# ----------------------------------------------------------------------------- defaults
# What vLLM 0.32 runs when a flag is absent, where that is a constant of its own: the config
# dataclass field's default, which `EngineArgs` (vllm/engine/arg_utils.py) takes as the flag's
# (`gpu_memory_utilization: float = CacheConfig.gpu_memory_utilization`, and so on). Read by
# `read_arg`, so that `--gpu-memory-utilization 0.92` on a server without the flag is no change.
DEFAULTS: dict[str, la.Default] = {
    "gpu_memory_utilization": la.Default(
        "vllm/config/cache.py:102 `gpu_memory_utilization: float = Field(default=0.92, ...)`",
        0.92,
    ),
    "kv_cache_dtype": la.Default(
        'vllm/config/cache.py `cache_dtype: CacheDType = "auto"` (resolved from the '
        "checkpoint at start-up, an explicit `auto` as the default)",
        "auto",
    ),
    "enforce_eager": la.Default("vllm/config/model.py:272 `enforce_eager: bool = False`", False),
    "kv_offloading_size": la.Default(
        "vllm/config/cache.py `kv_offloading_size: float | None = None`: no offloading", None
    ),
    "kv_offloading_backend": la.Default(
        'vllm/config/cache.py `kv_offloading_backend: KVOffloadingBackend = "native"`',
        "native",
    ),
    "kv_cache_memory_bytes": la.Default(
        "vllm/config/cache.py `kv_cache_memory_bytes: int | None = None`: sized from "
        "gpu_memory_utilization",
        None,
    ),
}
# Absent flags whose value vLLM works out at start-up from what kvpilot cannot know: a change to
# any value of them is a real change (the server may have picked another).
AT_START: dict[str, str] = {
    "max_num_seqs": "vLLM picks it from the GPU and the model at start-up "
    "(vllm/engine/arg_utils.py `EngineArgs.get_batch_defaults`)",
    "max_num_batched_tokens": "vLLM picks it from the GPU and the model at start-up "
    "(vllm/engine/arg_utils.py `EngineArgs.get_batch_defaults`)",
    "block_size": "vLLM's platform and attention backend pick it at start-up "
    "(vllm/config/cache.py `block_size = None`: 16 on GPU, 128 on CPU)",
    "max_model_len": "vLLM derives it from the model's config.json at start-up",
    "enable_prefix_caching": "vLLM turns it on where the model supports it "
    "(vllm/engine/arg_utils.py: the flag's default is None)",
    "max_cudagraph_capture_size": "vLLM derives it from max_num_seqs at start-up "
    "(vllm/config/compilation.py), unless a compilation config sets it",
}
ABSENT = la.when_absent(DEFAULTS, AT_START, "vLLM")


def read_arg(args: Sequence[str], name: str) -> ArgReading:
    """An allowed argument as vLLM would run it from `args` (`base.ArgReading`): every spelling
    its parser reads (aliases, `--no-FLAG`, underscores), typed (`4k` is 4000, `-1` is `auto`)."""
    spec = spec_of(name)
    return la.read(spec, args, ABSENT(spec.name), underscores=True)


def launch_settings(args: Sequence[str]) -> dict[str, Any]:
    """The allowed arguments an argument list sets, typed (what kvpilot knows of a server it
    launched when the server itself does not say). Values vLLM would refuse are left out."""
    found: dict[str, Any] = {}
    for name, spec in ALLOWED.items():
        text = arg_value(args, name)
        if text is None:
            continue
        try:
            found[name] = spec.parse(text)
        except ArgError:
            continue
    for name, flags in PARALLEL_FLAGS.items():
        text = la.value_of(args, flags, underscores=True)
        if text is not None and text.isdigit():
            found[name] = int(text)
    found.update(kv_transfer(la.value_of(args, ("--kv-transfer-config",), underscores=True)))
    found.update(speculative(args))
    return found


def speculative(args: Sequence[str]) -> dict[str, Any]:
    """The drafter `--speculative-config` (or `-sc`) and its short forms `--spec-method`,
    `--spec-model`, `--spec-tokens` name (engine/arg_utils.py `create_speculative_config`), as
    `speculative_method`, `speculative_model`, `num_speculative_tokens`; read, never edited.
    Where no method is named, it is inferred from the model's name as vLLM does first
    (config/speculative.py: "eagle-" -> eagle, "eagle3" -> eagle3; a draft with no model is
    the target's own MTP module); a name that says nothing is left `draft_model`."""
    config: dict[str, Any] = {}
    text = la.value_of(args, ("--speculative-config", "-sc"), underscores=True)
    if text:
        try:
            loaded = json.loads(text)
        except ValueError:
            loaded = None
        if isinstance(loaded, dict):
            config = {str(k).replace("-", "_"): v for k, v in loaded.items()}
    for flag, key in (
        ("--spec-method", "method"),
        ("--spec-model", "model"),
        ("--spec-tokens", "num_speculative_tokens"),
    ):
        value = la.value_of(args, (flag,), underscores=True)
        if value is not None:
            config[key] = value
    return speculative_settings(config)


def speculative_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """kvpilot's keys for a speculative config's method, draft model and token count."""
    if not config:
        return {}
    model = config.get("model")
    method = config.get("method")
    if not method:
        name = str(model or "").lower()
        method = (
            "eagle3"
            if "eagle3" in name
            else "eagle"
            if "eagle-" in name
            else "draft_model"
            if model
            else "mtp"
        )
    out: dict[str, Any] = {"speculative_method": str(method)}
    if model:
        out["speculative_model"] = str(model)
    tokens = config.get("num_speculative_tokens")
    if isinstance(tokens, int) or (isinstance(tokens, str) and tokens.isdigit()):
        out["num_speculative_tokens"] = int(tokens)
    return out


def kv_transfer(text: str | None) -> dict[str, Any]:
    """`--kv-transfer-config` JSON's connector and role (vllm/config/kv_transfer.py), which
    kvpilot reads and never edits; {} where absent or not JSON."""
    if not text:
        return {}
    try:
        config = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(config, dict):
        return {}
    return {k: str(config[k]) for k in ("kv_connector", "kv_role") if config.get(k)}


# Counts kvpilot reads but does not edit (arg_utils.py: `--tensor-parallel-size/-tp`,
# `--data-parallel-size/-dp`).
PARALLEL_FLAGS = {
    "tensor_parallel_size": ("--tensor-parallel-size", "-tp"),
    "data_parallel_size": ("--data-parallel-size", "-dp"),
    # the admission cap (config/scheduler.py), read to judge the batch, never edited
    "max_num_active_seqs": ("--max-num-active-seqs",),
}
