"""Whether a change changes anything, row by row: the decision over typed facts, then what the
engines make of real argument lists (their spellings and their own defaults)."""

from __future__ import annotations

from typing import Any

import pytest

from playbooks.engines import engine_named
from playbooks.engines.base import ArgReading
from playbooks.experiments.no_change import (
    ChangeFacts,
    NothingToChange,
    facts_of,
    nothing_changes,
    trial_args,
    unchanged_by,
)

WHERE = "its launch arguments as its process launcher reports them"
MFS = "mem_fraction_static"
FLAG = "--mem-fraction-static"


def set_(value: Any, spelt: str = "") -> ArgReading:
    return ArgReading(MFS, FLAG, "set", value, spelt=spelt or f"{FLAG} {value}")


def default(value: Any) -> ArgReading:
    return ArgReading(MFS, FLAG, "default", value, source="fields/schedule.py")


UNKNOWN = ArgReading(MFS, FLAG, "unknown", source="SGLang picks it from the GPU's memory")


@pytest.mark.parametrize(
    ("before", "after", "rest_same", "says"),
    [
        # the same value, however it was spelt: nothing changes
        (set_(0.85, f"{FLAG} 0.850"), set_(0.85), True, f"already 0.85 (`{FLAG} 0.850` in"),
        (set_(True, "--enable-hicache"), set_(True), True, "already on (`--enable-hicache`"),
        # absent, and the engine's default is the value asked for
        (default(False), set_(False), True, f"already off (no `{FLAG}` in"),
        (default(0.92), set_(0.92), True, "SGLang's default is 0.92: fields/schedule.py"),
        # a value that differs, or one the engine works out itself, is a change
        (set_(0.85), set_(0.88), True, None),
        (UNKNOWN, set_(0.85), True, None),
        (set_(0.85), UNKNOWN, True, None),
        (default(0.92), set_(0.9), True, None),
        (set_(1), set_(True), True, None),  # a count is not an on/off flag
        # the same value, but another argument moved with it
        (set_(0.85), set_(0.85), False, None),
    ],
)
def test_the_decision(
    before: ArgReading, after: ArgReading, rest_same: bool, says: str | None
) -> None:
    found = nothing_changes(ChangeFacts("kimi", "SGLang", (before,), (after,), rest_same, WHERE))
    if says is None:
        assert found is None
    else:
        assert found is not None and found.startswith("nothing would change on `kimi`: ")
        assert says in found and WHERE in found, found


def test_every_argument_must_stay_for_nothing_to_change() -> None:
    one, other = set_(0.85), ArgReading("schedule_policy", "--schedule-policy", "set", "lpm")
    moved = ArgReading("schedule_policy", "--schedule-policy", "set", "fcfs")
    assert (
        nothing_changes(ChangeFacts("kimi", "SGLang", (one, other), (one, moved), True, WHERE))
        is None
    )
    both = nothing_changes(ChangeFacts("kimi", "SGLang", (one, other), (one, other), True, WHERE))
    assert both is not None and "mem_fraction_static is already 0.85" in both
    assert "schedule_policy is already lpm" in both


SGLANG = ["--model-path", "/m", "--mem-fraction-static", "0.85", "--enable-metrics"]
VLLM = ["serve", "/m", "--max-num-seqs", "64", "--enable-prefix-caching"]


@pytest.mark.parametrize(
    ("engine", "args", "change", "why"),
    [
        # SGLang: the value it runs, spelt otherwise
        ("sglang", SGLANG, {MFS: 0.85}, "mem_fraction_static is already 0.85"),
        ("sglang", ["--mem-fraction-static=0.850"], {MFS: 0.85}, "`--mem-fraction-static=0.850`"),
        ("sglang", ["--enable-hicache"], {"enable_hierarchical_cache": True}, "already on"),
        ("sglang", ["--kv-cache-dtype", "bf16"], {"kv_cache_dtype": "bfloat16"}, "bfloat16"),
        # SGLang: an absent flag that is the engine's constant default
        ("sglang", SGLANG, {"enable_hierarchical_cache": False}, "is already off (no `--enable"),
        ("sglang", SGLANG, {"schedule_policy": "fcfs"}, "schedule_policy is already fcfs"),
        ("sglang", SGLANG, {"schedule_conservativeness": 1.0}, "fields/schedule.py"),
        ("sglang", SGLANG, {"max_prefill_tokens": 16384}, "max_prefill_tokens is already 16384"),
        ("sglang", SGLANG, {"kv_cache_dtype": "auto"}, "kv_cache_dtype is already auto"),
        ("sglang", SGLANG, {"hicache_size": 0}, "hicache_size is already 0"),
        # SGLang: real changes
        ("sglang", SGLANG, {MFS: 0.88}, None),
        ("sglang", SGLANG, {"schedule_policy": "lpm"}, None),
        ("sglang", SGLANG, {"enable_hierarchical_cache": True}, None),
        ("sglang", SGLANG, {"kv_cache_dtype": "fp8_e4m3"}, None),
        # absent, and SGLang sizes it from the GPU at start-up: setting it is a change
        ("sglang", ["--model-path", "/m"], {MFS: 0.85}, None),
        ("sglang", ["--model-path", "/m"], {"chunked_prefill_size": 8192}, None),
        ("sglang", ["--model-path", "/m"], {"max_running_requests": 64}, None),
        # an unreadable value is no value kvpilot can compare
        ("sglang", ["--mem-fraction-static", "lots"], {MFS: 0.85}, None),
        # vLLM: the value it runs, spelt otherwise
        ("vllm", VLLM, {"max_num_seqs": 64}, "max_num_seqs is already 64"),
        ("vllm", ["--max_num_seqs=64"], {"max_num_seqs": 64}, "`--max_num_seqs=64`"),
        ("vllm", VLLM, {"enable_prefix_caching": True}, "enable_prefix_caching is already on"),
        ("vllm", ["--max-num-batched-tokens", "4k"], {"max_num_batched_tokens": 4000}, "4000"),
        ("vllm", ["--max-model-len", "-1"], {"max_model_len": -1}, "max_model_len is already"),
        ("vllm", ["--device-memory-utilization", "0.90"], {"gpu_memory_utilization": 0.9}, "0.9"),
        # vLLM: an absent flag that is the engine's constant default
        ("vllm", VLLM, {"gpu_memory_utilization": 0.92}, "config/cache.py:102"),
        ("vllm", VLLM, {"enforce_eager": False}, "enforce_eager is already off (no `--enforce"),
        ("vllm", VLLM, {"kv_cache_dtype": "auto"}, "kv_cache_dtype is already auto"),
        ("vllm", VLLM, {"kv_offloading_backend": "native"}, "already native"),
        # vLLM: real changes
        ("vllm", VLLM, {"max_num_seqs": 128}, None),
        ("vllm", VLLM, {"enable_prefix_caching": False}, None),
        ("vllm", VLLM, {"gpu_memory_utilization": 0.95}, None),
        ("vllm", ["--no-enable-prefix-caching"], {"enable_prefix_caching": True}, None),
        # absent, and vLLM works it out at start-up (the GPU, the model's support)
        ("vllm", ["serve", "/m"], {"max_num_seqs": 256}, None),
        ("vllm", ["serve", "/m"], {"enable_prefix_caching": True}, None),
        ("vllm", ["serve", "/m"], {"block_size": 16}, None),
        # a compilation config holding it: kvpilot's edit takes it out, which is a change
        ("vllm", ["-cc", '{"max_cudagraph_capture_size": 64}'],
         {"max_cudagraph_capture_size": 64}, None),
    ],
)  # fmt: skip
def test_what_each_engine_makes_of_an_argument_list(
    engine: str, args: list[str], change: dict[str, Any], why: str | None
) -> None:
    eng = engine_named(engine)
    trial = eng.with_change(args, change)
    found = nothing_changes(facts_of(eng, "kimi", args, trial, change, WHERE))
    if why is None:
        assert found is None, found
        assert trial_args(eng, "kimi", args, change, WHERE) == trial
        assert unchanged_by(eng, "kimi", args, WHERE)(change) is None
    else:
        assert found is not None and why in found, found
        with pytest.raises(NothingToChange, match="nothing would change"):
            trial_args(eng, "kimi", args, change, WHERE)
        assert unchanged_by(eng, "kimi", args, WHERE)(change) == found


def test_a_change_that_moves_another_argument_is_a_change() -> None:
    """SGLang turns the host tier on with a host pool size; the pool size alone is no change."""
    eng = engine_named("sglang")
    args = ["--model-path", "/m", "--hicache-size", "40"]
    change = eng.parse_change(["hicache_size=40"])  # adds enable_hierarchical_cache=True
    assert nothing_changes(facts_of(eng, "k", args, eng.with_change(args, change), change,
                                    WHERE)) is None  # fmt: skip
    args = [*args, "--enable-hierarchical-cache"]
    assert nothing_changes(facts_of(eng, "k", args, eng.with_change(args, change), change,
                                    WHERE)) is not None  # fmt: skip
