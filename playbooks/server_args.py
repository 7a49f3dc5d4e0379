"""The SGLang server arguments kvpilot may reason about or change, with validation.

One allow-list serves `diagnose --consider`, proposals and (later) the launchers: a key outside it
is refused, and every value is parsed and range-checked here, never passed through as text.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

KV_DTYPES = ("auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2")
WRITE_POLICIES = ("write_through", "write_back", "write_through_selective")


class ArgError(ValueError):
    """A server argument or value that is not allowed; the message says how to fix it."""


def _float_in(
    lo: float, hi: float, lo_open: bool = True, hi_open: bool = True
) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ArgError(f"expected a number, got {text!r}") from None
        if (value <= lo if lo_open else value < lo) or (value >= hi if hi_open else value > hi):
            lo_b = "(" if lo_open else "["
            hi_b = ")" if hi_open else "]"
            raise ArgError(f"must be in {lo_b}{lo:g}, {hi:g}{hi_b}, got {text}")
        return value

    return parse


def _int_at_least(lo: int, allow: tuple[int, ...] = ()) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ArgError(f"expected a whole number, got {text!r}") from None
        if value < lo and value not in allow:
            extra = f" (or {', '.join(map(str, allow))})" if allow else ""
            raise ArgError(f"must be at least {lo}{extra}, got {text}")
        return value

    return parse


def _choice(options: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in options:
            raise ArgError(f"must be one of {', '.join(options)}, got {text!r}")
        return text

    return parse


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ArgError(f"expected true or false, got {text!r}")


@dataclass(frozen=True)
class ArgSpec:
    name: str
    parse: Callable[[str], Any]
    meaning: str


ALLOWED: dict[str, ArgSpec] = {
    spec.name: spec
    for spec in (
        ArgSpec(
            "mem_fraction_static",
            _float_in(0.0, 1.0),
            "share of GPU memory for weights and KV cache",
        ),
        ArgSpec("kv_cache_dtype", _choice(KV_DTYPES), "KV cache element type"),
        ArgSpec("max_total_tokens", _int_at_least(1), "cap on the KV pool in tokens"),
        ArgSpec("max_running_requests", _int_at_least(1), "cap on concurrently running requests"),
        ArgSpec(
            "chunked_prefill_size",
            _int_at_least(1, allow=(-1,)),
            "prefill chunk in tokens (-1 disables chunking)",
        ),
        ArgSpec("max_prefill_tokens", _int_at_least(1), "tokens per prefill batch"),
        ArgSpec(
            "schedule_conservativeness",
            _float_in(0.0, 10.0, hi_open=False),
            "how cautiously new requests are admitted",
        ),
        ArgSpec("enable_hierarchical_cache", _bool, "host-RAM tier for the prefix cache"),
        ArgSpec("hicache_ratio", _float_in(0.0, 100.0), "host pool size relative to the GPU pool"),
        ArgSpec(
            "hicache_size",
            _float_in(0.0, 10_000.0, lo_open=False),
            "host pool size in GB per rank (0 = use the ratio)",
        ),
        ArgSpec("hicache_write_policy", _choice(WRITE_POLICIES), "when KV is copied to host"),
        ArgSpec("page_size", _int_at_least(1), "KV page size in tokens"),
    )
}


def normalise_key(key: str) -> str:
    return key.strip().lstrip("-").replace("-", "_")


def parse_assignment(text: str) -> tuple[str, Any]:
    """Parse `KEY=VALUE` (`mem_fraction_static=0.9` or `--mem-fraction-static=0.9`)."""
    key, eq, value = text.partition("=")
    if not eq or not key.strip() or not value.strip():
        raise ArgError(f"{text!r} is not KEY=VALUE (for example mem_fraction_static=0.9)")
    name = normalise_key(key)
    spec = ALLOWED.get(name)
    if spec is None:
        known = ", ".join(sorted(ALLOWED))
        raise ArgError(f"{name!r} is not a server argument kvpilot can change; known: {known}")
    try:
        return name, spec.parse(value.strip())
    except ArgError as exc:
        raise ArgError(f"{name}: {exc}") from None


def parse_change(items: list[str]) -> dict[str, Any]:
    change: dict[str, Any] = {}
    for item in items:
        name, value = parse_assignment(item)
        if name in change and change[name] != value:
            raise ArgError(f"{name} is given twice with different values")
        change[name] = value
    if change.get("hicache_size") or change.get("hicache_ratio"):
        change.setdefault("enable_hierarchical_cache", True)
    return change


def to_cli(change: dict[str, Any]) -> list[str]:
    """The change as SGLang command-line flags (booleans become bare flags or are dropped)."""
    out: list[str] = []
    for name, value in change.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            if value:
                out.append(flag)
        else:
            out += [flag, str(value)]
    return out
