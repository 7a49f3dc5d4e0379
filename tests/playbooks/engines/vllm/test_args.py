"""The vLLM allow-list against vLLM 0.32.0's own parser and config checks, and its spelling.

`arg_checks.json` is what the real parser said of each command line (recorded with
`.venv-vllm/bin/python tests/real_vllm/check_args.py --builtin`: vLLM's CLI parser, its serve
validation and `create_engine_config`, no server). Every case whose flags are all on kvpilot's
allow-list is put through kvpilot's own parsing: what kvpilot accepts, vLLM accepted with the
same value; what vLLM refused, kvpilot refuses too. Where kvpilot is stricter the case is named.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from playbooks.engines.base import ArgError
from playbooks.engines.types import DiagnoseSettings
from playbooks.engines.vllm import ENGINE
from playbooks.engines.vllm.allow_list import (
    ALLOWED,
    AUTO,
    arg_value,
    launch_settings,
    parse_change,
    spec_of,
    with_change,
)
from tests.playbooks.engines.vllm.recorded import RecordedModel, json_file, recorded_settings

CASES: list[dict[str, Any]] = json_file("arg_checks.json")
# The resolved config field for each allow-list entry (check_args.py `_resolved`).
RESOLVED = {"kv_cache_dtype": "cache_dtype"}
# Accepted by vLLM, refused by kvpilot, and why (args.py says the same next to the entries).
STRICTER = {
    "block_size_7": "backends take multiples of 16; kvpilot allows 16, 32, 64, 128",
    "kv_bytes_0": "0 KV bytes is no size at all (vLLM then sizes from the utilization)",
}
# Refused by vLLM because of the server's other settings, which a value alone does not show:
# kvpilot's rules for the recorded server refuse them (its budget is 2048 tokens, its model's
# context 4096).
IN_CONTEXT = {"max_num_seqs_4096", "max_model_len_100000"}


def items(args: list[str]) -> list[str] | None:
    """A recorded command line as kvpilot's KEY=VALUE items; None where a flag is not kvpilot's."""
    out, i = [], 0
    while i < len(args):
        flag = args[i]
        negated = flag.startswith("--no-")
        try:
            spec = spec_of(flag.removeprefix("--no-") if negated else flag)
        except ArgError:
            return None
        if not spec.takes_value:
            out.append(f"{spec.name}={'false' if negated else 'true'}")
            i += 1
            continue
        out.append(f"{spec.name}={args[i + 1]}")
        i += 2
    return out


COVERED = [c for c in CASES if c["name"] != "baseline" and items(c["args"]) is not None]


def test_the_recording_covers_every_kind_of_entry() -> None:
    assert len(COVERED) >= 25
    flags = {spec_of(i.split("=")[0]).name for c in COVERED for i in items(c["args"]) or []}
    assert {"gpu_memory_utilization", "kv_cache_dtype", "max_num_seqs", "block_size"} <= flags


@pytest.mark.parametrize("case", COVERED, ids=[c["name"] for c in COVERED])
def test_kvpilot_accepts_only_what_vllm_accepts(case: dict[str, Any]) -> None:
    try:
        change = parse_change(items(case["args"]) or [])
    except ArgError:
        assert not case["ok"] or case["name"] in STRICTER, case
        return
    if case["name"] in IN_CONTEXT:
        rules = ENGINE.rules_for(recorded_settings(), DiagnoseSettings(models=RecordedModel()))
        assert not case["ok"] and rules.judge(change).verdict == "unsafe"
        return
    assert case["ok"], f"kvpilot accepts what vLLM refused: {case.get('error')}"
    resolved = case["resolved"]
    for name, value in change.items():
        field = RESOLVED.get(name, name)
        if field in resolved and value != AUTO:
            assert resolved[field] == value, (name, value, resolved[field])
        # spelt back onto a command line, the value reads as vLLM read it
        spelt = arg_value(with_change([], {name: value}), name)
        assert spelt is not None and ALLOWED[name].parse(spelt) == value


def test_the_stricter_cases_are_still_refused() -> None:
    for name in STRICTER:
        case = next(c for c in CASES if c["name"] == name)
        assert case["ok"]
        with pytest.raises(ArgError):
            parse_change(items(case["args"]) or [])


@pytest.mark.parametrize(
    ("item", "value"),
    [
        ("max_num_batched_tokens=4k", 4000),  # decimal suffix, as vLLM reads it
        ("kv_cache_memory_bytes=64M", 64 << 20),  # binary suffix
        ("kv_cache_memory_bytes=1.5g", 1_500_000_000),
        ("max_model_len=auto", AUTO),
        ("max_model_len=1k", 1000),
        ("device_memory_utilization=0.8", 0.8),
        ("--enable-prefix-caching=off", False),
    ],
)
def test_vllms_own_spellings_are_read(item: str, value: Any) -> None:
    assert list(parse_change([item]).values()) == [value]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("kv_cache_memory_bytes=1.5G", "decimals are not allowed"),  # vLLM refuses it too
        ("gpu_memory_utilization=1.5", "must be in (0, 1]"),
        ("gpu_memory_utilization=0", "must be in (0, 1]"),
        ("max_num_seqs=2.5", "whole number"),
        ("block_size=7", "must be one of 16, 32, 64, 128"),
        ("kv_cache_dtype=nvfp4", "must be one of"),
        ("kv_offloading_backend=disk", "must be one of native, lmcache"),
        ("swap_space=4", "not a vLLM argument kvpilot can change"),
    ],
)
def test_refusals_say_what_is_allowed(item: str, message: str) -> None:
    with pytest.raises(ArgError, match=re.escape(message)):
        parse_change([item])


def test_the_token_budget_must_cover_the_sequence_cap() -> None:
    # config/scheduler.py: "max_num_batched_tokens (8) must be greater than or equal to
    # max_num_seqs (16)" (recorded: batched_tokens_lt_seqs)
    with pytest.raises(ArgError, match="at least max_num_seqs"):
        parse_change(["max_num_batched_tokens=8", "max_num_seqs=16"])
    with pytest.raises(ArgError, match="at least max_num_seqs"):
        with_change(["--max-num-batched-tokens", "2048"], {"max_num_seqs": 4096})


# (argument list, change, the list after it)
EDITS: list[tuple[list[str], dict[str, Any], list[str]]] = [
    # every spelling of the argument goes: dashes, underscores, `=`, the alias
    (
        ["serve", "/m", "--gpu-memory-utilization", "0.9", "--device-memory-utilization=0.8"],
        {"gpu_memory_utilization": 0.95},
        ["serve", "/m", "--gpu-memory-utilization", "0.95"],
    ),
    (
        ["serve", "/m", "--max_num_seqs", "8"],
        {"max_num_seqs": 64},
        ["serve", "/m", "--max-num-seqs", "64"],
    ),
    # an on/off flag takes no value: the positional after it stays
    (
        ["--enforce-eager", "/models/m", "--port", "8000"],
        {"enforce_eager": False},
        ["/models/m", "--port", "8000", "--no-enforce-eager"],
    ),
    (
        ["serve", "/m", "--no-enable-prefix-caching"],
        {"enable_prefix_caching": True},
        ["serve", "/m", "--enable-prefix-caching"],
    ),
    # None takes the argument out, leaving vLLM's default
    (["serve", "/m", "--block-size", "32"], {"block_size": None}, ["serve", "/m"]),
    # ints spelt as digits, an automatic length as vLLM's word for it
    (
        [],
        {"max_num_batched_tokens": 8192.0, "max_model_len": AUTO},
        [
            "--max-num-batched-tokens",
            "8192",
            "--max-model-len",
            "auto",
        ],
    ),
]


@pytest.mark.parametrize(("args", "change", "after"), EDITS)
def test_with_change(args: list[str], change: dict[str, Any], after: list[str]) -> None:
    assert with_change(args, change) == after


def test_an_on_off_flag_reads_as_its_last_spelling() -> None:
    args = ["--enable-prefix-caching", "--no-enable-prefix-caching"]
    assert arg_value(args, "enable_prefix_caching") == "false"
    assert arg_value(["--enforce_eager"], "enforce_eager") == "true"
    assert arg_value([], "enforce_eager") is None


def test_launch_settings_read_the_allowed_arguments_typed() -> None:
    args = ["serve", "/m", "--max-num-seqs", "64", "--kv-cache-dtype", "fp9", "-tp", "4"]
    assert launch_settings(args) == {"max_num_seqs": 64, "tensor_parallel_size": 4}


# vLLM refuses the capture-size flag beside the same key in the compilation config ("... are
# mutually exclusive", vllm/engine/arg_utils.py:2796-2801), so the edit takes the key out there.
CC = "--compilation-config"
COMPILATION_CONFIG_EDITS: list[tuple[list[str], list[str]]] = [
    ([CC, '{"max_cudagraph_capture_size": 256, "mode": 0}'], [CC, '{"mode": 0}']),
    ([f'{CC}={{"max_cudagraph_capture_size": 256}}', "--port", "8000"], ["--port", "8000"]),
    (["-cc", '{"max_cudagraph_capture_size": 256}'], []),
    (["-cc.max_cudagraph_capture_size=256", "-cc.mode=0"], ["-cc.mode=0"]),
    (["--compilation_config.max_cudagraph_capture_size", "256"], []),
    ([CC, '{"mode": 0}'], [CC, '{"mode": 0}']),  # nothing of the capture size: left alone
    (["-cc", "3"], ["-cc", "3"]),  # not a JSON object: left for vLLM to judge
]


@pytest.mark.parametrize(("args", "rest"), COMPILATION_CONFIG_EDITS)
def test_a_capture_size_edit_takes_it_out_of_the_compilation_config(
    args: list[str], rest: list[str]
) -> None:
    change = {"max_cudagraph_capture_size": 64}
    assert with_change(["serve", "/m", *args], change) == [
        "serve",
        "/m",
        *rest,
        "--max-cudagraph-capture-size",
        "64",
    ]
