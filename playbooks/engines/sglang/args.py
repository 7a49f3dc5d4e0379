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

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from playbooks.engines.base import ArgError

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


@dataclass(frozen=True)
class IntValue:
    """An SGLang `type=int` (or `human_readable_int`) flag: held as int, spelt as digits."""

    lo: int
    hi: int
    allow: tuple[int, ...] = ()  # accepted below `lo` (-1 = off)
    unit: str = ""
    power_of_two: bool = False

    def check(self, raw: object) -> int:
        """The value as an int; integral floats (40.0 from JSON or arithmetic) are accepted."""
        if isinstance(raw, bool):
            raise ArgError(f"expected a whole number{self._of()}, got {raw}")
        if isinstance(raw, str):
            return self.parse(raw)
        if isinstance(raw, float):
            if not math.isfinite(raw) or not raw.is_integer():
                raise ArgError(f"must be a whole number{self._of()}, got {raw:g}")
            raw = int(raw)
        if not isinstance(raw, int):
            raise ArgError(f"expected a whole number{self._of()}, got {raw!r}")
        if raw in self.allow:
            return raw
        if raw < self.lo:
            extra = f" (or {', '.join(map(str, self.allow))})" if self.allow else ""
            raise ArgError(f"must be at least {self.lo}{extra}, got {raw}")
        if raw > self.hi:
            raise ArgError(f"must be at most {self.hi}, got {raw}")
        if self.power_of_two and raw & (raw - 1):
            raise ArgError(f"must be a power of two (1, 2, 4, ... {self.hi}), got {raw}")
        return raw

    def parse(self, text: str) -> int:
        text = text.strip()
        number: int | float
        try:
            number = int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                raise ArgError(f"expected a whole number{self._of()}, got {text!r}") from None
        return self.check(number)

    def spell(self, value: int) -> str:
        return str(value)

    def _of(self) -> str:
        return f" of {self.unit}" if self.unit else ""


@dataclass(frozen=True)
class FloatValue:
    """An SGLang `type=float` flag: held as a finite float, spelt as Python's shortest repr."""

    lo: float
    hi: float
    lo_open: bool = True
    hi_open: bool = True

    def check(self, raw: object) -> float:
        if isinstance(raw, str):
            return self.parse(raw)
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise ArgError(f"expected a number, got {raw!r}")
        value = float(raw)
        below = value <= self.lo if self.lo_open else value < self.lo
        above = value >= self.hi if self.hi_open else value > self.hi
        if not math.isfinite(value) or below or above:
            lo_b = "(" if self.lo_open else "["
            hi_b = ")" if self.hi_open else "]"
            raise ArgError(f"must be in {lo_b}{self.lo:g}, {self.hi:g}{hi_b}, got {raw}")
        return value

    def parse(self, text: str) -> float:
        try:
            number = float(text)
        except ValueError:
            raise ArgError(f"expected a number, got {text!r}") from None
        return self.check(number)

    def spell(self, value: float) -> str:
        return repr(value)


@dataclass(frozen=True)
class ChoiceValue:
    """An SGLang `choices=[...]` flag: one of the listed words, spelt as is."""

    options: tuple[str, ...]

    def check(self, raw: object) -> str:
        if not isinstance(raw, str) or raw not in self.options:
            raise ArgError(f"must be one of {', '.join(self.options)}, got {raw!r}")
        return raw

    def parse(self, text: str) -> str:
        return self.check(text.strip())

    def spell(self, value: str) -> str:
        return value


@dataclass(frozen=True)
class BoolValue:
    """An SGLang `store_true` flag: on is the bare flag, off is its absence."""

    def check(self, raw: object) -> bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str):
            return self.parse(raw)
        raise ArgError(f"expected true or false, got {raw!r}")

    def parse(self, text: str) -> bool:
        lowered = text.strip().lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise ArgError(f"expected true or false, got {text!r}")

    def spell(self, value: bool) -> str:
        raise AssertionError("a store_true flag has no value to spell")


Value = IntValue | FloatValue | ChoiceValue | BoolValue


@dataclass(frozen=True)
class ArgSpec:
    name: str
    value: Value
    meaning: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def parse(self, text: str) -> Any:
        """Operator text to the value SGLang's type gives (raises ArgError naming the key)."""
        try:
            return self.value.parse(text)
        except ArgError as exc:
            raise ArgError(f"{self.name}: {exc}") from None

    def check(self, raw: object) -> Any:
        """Any value (parsed, stored as JSON, computed) to its checked, canonical form."""
        try:
            return self.value.check(raw)
        except ArgError as exc:
            raise ArgError(f"{self.name}: {exc}") from None

    def cli(self, raw: object) -> list[str]:
        """The command-line tokens for the value: `[flag, text]`, `[flag]` or `[]` (flag off)."""
        value = self.check(raw)
        if isinstance(self.value, BoolValue):
            return [self.flag] if value else []
        return [self.flag, self.value.spell(value)]


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
        ArgSpec("enable_hierarchical_cache", BoolValue(), "host-RAM tier for the prefix cache"),
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
        ArgSpec(
            "attn_dp_size",
            IntValue(1, 1024, unit="ranks"),
            "attention data-parallel ranks (a divisor of the TP size)",
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


def normalise_key(key: str) -> str:
    return key.strip().lstrip("-").replace("-", "_")


def spec_of(key: str) -> ArgSpec:
    name = normalise_key(key)
    spec = ALLOWED.get(name)
    if spec is None:
        known = ", ".join(sorted(ALLOWED))
        raise ArgError(f"{name!r} is not a server argument kvpilot can change; known: {known}")
    return spec


def parse_assignment(text: str) -> tuple[str, Any]:
    """Parse `KEY=VALUE` (`mem_fraction_static=0.9` or `--mem-fraction-static=0.9`)."""
    key, eq, value = text.partition("=")
    if not eq or not key.strip() or not value.strip():
        raise ArgError(f"{text!r} is not KEY=VALUE (for example mem_fraction_static=0.9)")
    spec = spec_of(key)
    return spec.name, spec.parse(value)


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


def parse_change(items: list[str]) -> dict[str, Any]:
    change: dict[str, Any] = {}
    for item in items:
        name, value = parse_assignment(item)
        if name in change and change[name] != value:
            raise ArgError(f"{name} is given twice with different values")
        change[name] = value
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
        out = _without(out, spec.flag)
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


def _without(args: list[str], flag: str) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(args):
        tok = args[i]
        if tok == flag:
            # skip the flag and its value, if the next token is one
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                i += 1
        elif not tok.startswith(flag + "="):
            out.append(tok)
        i += 1
    return out


def arg_value(args: Sequence[str], name: str) -> str | None:
    """The value of `--name` in an argument list (True for a bare flag as "true")."""
    flag = "--" + normalise_key(name).replace("_", "-")
    for i, tok in enumerate(args):
        if tok == flag:
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                return args[i + 1]
            return "true"
        if tok.startswith(flag + "="):
            return tok.split("=", 1)[1]
    return None
