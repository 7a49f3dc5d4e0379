"""The server-argument edits kvpilot can emit, and what SGLang 0.5.23 declares for those flags.

One list of cases feeds the fast twin check (tests/conformance/test_twin_arg_types.py) and the
real-parser check (tests/real_sglang/test_real_arg_parser.py), so the twin and real SGLang are
held to the same edits. The cases are generated per kind of allow-list entry (playbooks/
server_args.py) with a fixed seed: boundaries, typical and large values, every choice, every
true/false spelling, other spellings of the same number, and seeded random draws, each pushed
through kvpilot's own `parse_change` and `with_change`, the path an operator's edit takes.
Refusals are generated the same way: what kvpilot refuses, spelt raw for SGLang, so a test can
ask whether SGLang refuses it too.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from typing import Any

from playbooks.engines.base import ArgError
from playbooks.engines.sglang.allow_list import (
    ALLOWED,
    BoolValue,
    ChoiceValue,
    FloatValue,
    IntValue,
    parse_change,
    with_change,
)

SEED = 20_523
RANDOM_DRAWS = 6  # per allow-list entry, on top of the fixed values


@dataclass(frozen=True)
class Declared:
    """One flag as SGLang's argparse has it (the real tier compares this with the parser)."""

    option_strings: tuple[str, ...]
    type_name: str | None  # the `type=` callable's __name__; None for store_true
    choices: tuple[str, ...] | None
    default: Any
    source: str  # where SGLang 0.5.23 declares it, under sglang/srt/arg_groups/


# Read from SGLang 0.5.23: fields are turned into flags by arg_utils.add_cli_args_from_dataclass
# (Optional[T] and T give type=T, bool gives store_true, Arg(type_parser=...) that parser).
SGLANG_0523: dict[str, Declared] = {
    "mem_fraction_static": Declared(
        ("--mem-fraction-static",),
        "float",
        None,
        None,
        "fields/schedule.py: mem_fraction_static: A[Optional[float], ...] = None",
    ),
    "kv_cache_dtype": Declared(
        ("--kv-cache-dtype",),
        "str",
        (
            "auto",
            "fp8_e5m2",
            "fp8_e4m3",
            "mxfp8",
            "bf16",
            "bfloat16",
            "nvfp4",
            "fp4_mx_block16",
        ),
        "auto",
        'fields/model.py: kv_cache_dtype: A[str, Arg(choices=[...], resolvable=True)] = "auto"',
    ),
    "max_total_tokens": Declared(
        ("--max-total-tokens",),
        "human_readable_int",
        None,
        None,
        "fields/schedule.py: max_total_tokens: A[Optional[int], "
        "Arg(type_parser=human_readable_int)] = None",
    ),
    "max_running_requests": Declared(
        ("--max-running-requests",),
        "int",
        None,
        None,
        "fields/schedule.py: max_running_requests: A[Optional[int], ...] = None",
    ),
    "chunked_prefill_size": Declared(
        ("--chunked-prefill-size",),
        "int",
        None,
        None,
        "fields/schedule.py: chunked_prefill_size: A[Optional[int], ...] = None",
    ),
    "max_prefill_tokens": Declared(
        ("--max-prefill-tokens",),
        "human_readable_int",
        None,
        16384,
        "fields/schedule.py: max_prefill_tokens: A[int, "
        "Arg(type_parser=human_readable_int)] = 16384",
    ),
    "schedule_conservativeness": Declared(
        ("--schedule-conservativeness",),
        "float",
        None,
        1.0,
        "fields/schedule.py: schedule_conservativeness: A[float, ...] = 1.0; "
        "validation_hook.py check_server_args asserts >= 0",
    ),
    "enable_hierarchical_cache": Declared(
        ("--enable-hierarchical-cache", "--enable-hicache"),
        None,
        None,
        False,
        'fields/memory.py: enable_hierarchical_cache: A[bool, Arg(aliases=["--enable-hicache"])]'
        " = False",
    ),
    "hicache_ratio": Declared(
        ("--hicache-ratio",),
        "float",
        None,
        None,
        "fields/memory.py: hicache_ratio: A[Optional[float], ...] = None",
    ),
    "hicache_size": Declared(
        ("--hicache-size",),
        "int",
        None,
        0,
        "fields/memory.py: hicache_size: A[int, ...] = 0 (GB)",
    ),
    "hicache_write_policy": Declared(
        ("--hicache-write-policy",),
        "str",
        ("write_back", "write_through", "write_through_selective"),
        "write_through",
        'fields/memory.py: hicache_write_policy: A[str, Arg(choices=[...])] = "write_through"',
    ),
    "page_size": Declared(
        ("--page-size",),
        "int",
        None,
        None,
        "fields/schedule.py: page_size: A[Optional[int], Arg(resolvable=True)] = None; "
        "validation_hook.py check_server_args: chunked_prefill_size % page_size == 0",
    ),
    "schedule_policy": Declared(
        ("--schedule-policy",),
        "str",
        (
            "lpm",
            "random",
            "fcfs",
            "dfs-weight",
            "lof",
            "priority",
            "routing-key",
            "hrrn",
            "shortest-prefill-first",
        ),
        "fcfs",
        'fields/schedule.py: schedule_policy: A[str, Arg(choices=[...])] = "fcfs"',
    ),
    "cuda_graph_max_bs_decode": Declared(
        ("--cuda-graph-max-bs-decode",),
        "int",
        None,
        None,
        "fields/exec_.py: cuda_graph_max_bs_decode: A[Optional[int], ...] = None",
    ),
    "attn_dp_size": Declared(
        ("--attn-dp-size", "--attention-data-parallel-size"),
        "int",
        None,
        1,
        "fields/parallel.py: attn_dp_size: int = 1; parallel_hook.py asserts tp % attn_dp == 0",
    ),
}

# The server's own arguments before the edit; each edit replaces or removes entries of it.
BASELINE = (
    "--enable-metrics",
    "--mem-fraction-static",
    "0.88",
    "--hicache-size=4",
    "--max-running-requests",
    "256",
)


@dataclass(frozen=True)
class Edit:
    """An edit kvpilot accepts: what the operator typed and the arguments it becomes."""

    key: str  # the allow-list entry the case is about ("a+b" for a combination)
    items: tuple[str, ...]  # KEY=VALUE as typed
    change: dict[str, Any]  # parse_change(items)
    args: tuple[str, ...]  # with_change(BASELINE, change)


@dataclass(frozen=True)
class Refusal:
    """A value kvpilot refuses, and the same intent spelt raw on SGLang's command line."""

    key: str
    text: str  # the value as typed
    why: str  # the kind of refusal; explained exceptions are keyed by (key, why)
    error: str  # kvpilot's message
    args: tuple[str, ...]


# Entries whose valid values depend on the server's TP size: their edits run on a TP8 server
# (SGLang asserts tp_size % attn_dp_size == 0, arg_groups/parallel_hook.py).
TP8 = ("--tp-size", "8")
ON_TP8 = {"attn_dp_size": ["1", "2", "4", "8", " 8 ", "8.0"]}


def _edit(key: str, items: list[str]) -> Edit:
    change = parse_change(items)
    base = [*BASELINE, *TP8] if key in ON_TP8 else list(BASELINE)
    return Edit(key, tuple(items), change, tuple(with_change(base, change)))


def _int_texts(v: IntValue, rng: random.Random) -> list[str]:
    if v.power_of_two:
        values = [2**k for k in range(v.hi.bit_length()) if 2**k <= v.hi]
        return [*map(str, values), f"{values[-1]}.0", f" {values[4]} "]
    typical = [1, 2, 16, 64, 256, 4096, 8192, 16384, 131072, 10**6, 10**7, v.hi]
    values = sorted({v.lo, v.lo + 1, *v.allow, *(n for n in typical if v.lo <= n <= v.hi)})
    lo_draw = max(v.lo, 1)
    for _ in range(RANDOM_DRAWS):
        values.append(int(math.exp(rng.uniform(math.log(lo_draw), math.log(v.hi)))))
    texts = [str(n) for n in values]
    texts += [f"{values[-1]}.0", f"{v.lo + 1}.0", "1e3" if v.lo <= 1000 <= v.hi else str(v.lo)]
    return texts


def _float_texts(v: FloatValue, rng: random.Random) -> list[str]:
    span = v.hi - v.lo
    values = [v.lo + span * f for f in (0.001, 0.25, 0.5, 0.75, 0.999)]
    if not v.lo_open:
        values.append(v.lo)
    if not v.hi_open:
        values.append(v.hi)
    values += [rng.uniform(v.lo, v.hi) for _ in range(RANDOM_DRAWS)]
    texts = [repr(x) for x in values if v.lo < x < v.hi or x in (v.lo, v.hi)]
    mid = v.lo + span / 2
    # other spellings of the middle: fixed point, exponent, and ".5" or a bare integer
    texts += [f"{mid:.3f}", f"{mid:e}", str(int(mid)) if mid >= 1 else f".{round(mid * 10)}"]
    return texts


def _bool_texts() -> list[str]:
    return ["true", "True", "1", "yes", "on", "false", "FALSE", "0", "no", "off"]


def accepted_edits(seed: int = SEED) -> list[Edit]:
    """Every generated edit, one allow-list entry at a time, then a few combinations."""
    rng = random.Random(seed)
    edits: list[Edit] = []
    for name, spec in ALLOWED.items():
        v = spec.value
        if name in ON_TP8:
            texts = ON_TP8[name]
        elif isinstance(v, IntValue):
            texts = _int_texts(v, rng)
        elif isinstance(v, FloatValue):
            texts = _float_texts(v, rng)
        elif isinstance(v, ChoiceValue):
            texts = [*v.options, f" {v.options[-1]} ", f"{v.options[0]} "]
        else:
            assert isinstance(v, BoolValue)
            texts = _bool_texts()
        edits += [_edit(name, [f"{name}={text}"]) for text in texts]
    # Entries that interact: page and chunk sizes, the host pool, memory with the KV type.
    for _ in range(RANDOM_DRAWS):
        page = 2 ** rng.randint(0, 7)
        chunk = page * rng.randint(1, 64)
        edits.append(
            _edit(
                "page_size+chunked_prefill_size",
                [f"page_size={page}", f"chunked_prefill_size={chunk}"],
            )
        )
    edits.append(
        _edit("page_size+chunked_prefill_size", ["page_size=64", "chunked_prefill_size=-1"])
    )
    policies = ALLOWED["hicache_write_policy"].value
    assert isinstance(policies, ChoiceValue)
    for policy in policies.options:
        size = rng.randint(1, 64)
        edits.append(
            _edit(
                "hicache",
                [f"hicache_size={size}", f"hicache_write_policy={policy}", "hicache_ratio=2"],
            )
        )
    dtypes = ALLOWED["kv_cache_dtype"].value
    assert isinstance(dtypes, ChoiceValue)
    for dtype in dtypes.options:
        mfs = round(rng.uniform(0.5, 0.95), 3)
        edits.append(_edit("memory", [f"mem_fraction_static={mfs}", f"kv_cache_dtype={dtype}"]))
    return edits


def _refusal(key: str, text: str, why: str) -> Refusal:
    try:
        parse_change([f"{key}={text}"])
    except ArgError as exc:
        flag = ALLOWED[key].flag
        raw = with_change(list(BASELINE), {key: None})  # the flag removed, then spelt raw
        return Refusal(key, text, why, str(exc), (*raw, flag, text.strip()))
    raise AssertionError(f"kvpilot accepts {key}={text}, listed as refused ({why})")


def refused_values() -> list[Refusal]:
    """Values kvpilot refuses, per allow-list entry, labelled by the kind of refusal."""
    out: list[Refusal] = []
    for name, spec in ALLOWED.items():
        v = spec.value
        if isinstance(v, IntValue):
            for n in sorted({v.lo - 1, -5, 0} - set(v.allow)):
                if n < v.lo:
                    why = "zero" if n == 0 else "below -1" if v.allow else "negative"
                    out.append(_refusal(name, str(n), why))
            out += [
                _refusal(name, str(v.hi + 1), "above the maximum"),
                _refusal(name, f"{max(v.lo, 1)}.5", "not a whole number"),
                _refusal(name, "abc", "not a number"),
                _refusal(name, "4k", "SI suffix"),
                _refusal(name, "1e400", "not finite"),
            ]
            if v.power_of_two:
                out += [_refusal(name, str(n), "not a power of two") for n in (3, 24, 1000)]
        elif isinstance(v, FloatValue):
            if v.lo_open:
                out.append(_refusal(name, f"{v.lo:g}", "at the open lower bound"))
            out.append(_refusal(name, f"{v.lo - 1:g}", "below the range"))
            if v.hi_open:
                out.append(_refusal(name, f"{v.hi:g}", "at the open upper bound"))
            out += [
                _refusal(name, f"{v.hi * 1.5:g}", "above the range"),
                _refusal(name, "nan", "not finite"),
                _refusal(name, "inf", "not finite"),
                _refusal(name, "abc", "not a number"),
            ]
        elif isinstance(v, ChoiceValue):
            declared = SGLANG_0523[name].choices or ()
            out += [_refusal(name, "fp9_e9m9", "not a choice")]
            out += [_refusal(name, v.options[-1].upper(), "not a choice")]
            out += [_refusal(name, c, "SGLang-only choice") for c in declared if c not in v.options]
        else:
            out.append(_refusal(name, "maybe", "not true or false"))
    return out


def refused_combinations() -> list[Refusal]:
    """Edits whose values are each fine but that SGLang refuses together."""
    out = []
    for page, chunk in ((16, 1000), (64, 100), (2048, 3000)):
        items = [f"page_size={page}", f"chunked_prefill_size={chunk}"]
        try:
            parse_change(items)
        except ArgError as exc:
            raw = with_change(list(BASELINE), {"page_size": None, "chunked_prefill_size": None})
            args = (*raw, "--page-size", str(page), "--chunked-prefill-size", str(chunk))
            key = "page_size+chunked_prefill_size"
            out.append(
                Refusal(key, " ".join(items), "chunk not a multiple of the page", str(exc), args)
            )
        else:
            raise AssertionError(f"kvpilot accepts {items}")
    return out


_SUFFIXED = re.compile(r"\d+(?:\.\d+)?(?:Ki|Mi|Gi|Ti|k|M|G|T)")


def sglang_parses(name: str, text: str) -> bool:
    """Whether SGLang 0.5.23's argparse takes `text` as the value of the flag, from its declared
    type alone (the real tier checks this against the real parser, the twin check against the
    twin's, for every refusal above)."""
    declared = SGLANG_0523[name]
    if declared.type_name is None:
        return False  # store_true: a value after the flag is an unrecognised argument
    if declared.choices is not None:
        return text in declared.choices
    convert = {"float": float, "int": int, "human_readable_int": int}[declared.type_name]
    try:
        convert(text)
    except ValueError:
        return declared.type_name == "human_readable_int" and bool(_SUFFIXED.fullmatch(text))
    return True
