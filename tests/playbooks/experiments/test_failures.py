"""What a failed start teaches (pure): only memory evidence, read from each engine's own lines.

Each row is an exit as the engine logs it and what kvpilot must make of it. SGLang's lines are
its 0.5.23 source's (the function next to each), its argparse refusal recorded from the real
0.5.23; vLLM's are the real 0.32.0's recorded refusals and start-up failures
(`tests/real_vllm/fixtures`), and the texts of its source where a GPU was needed to provoke them
(as tests/playbooks/engines/vllm/test_signatures.py). A start still loading at the ready timeout
is no exit at all: it teaches nothing whatever the engine.
"""

from __future__ import annotations

import signal

import pytest

from playbooks.campaigns.policy import bound_from
from playbooks.engines import engine_named
from playbooks.engines.exits import Failure, last_log_line
from playbooks.experiments import steps
from playbooks.experiments.failures import (
    StillLoading,
    exited,
    failure_of,
    teaches_about_memory,
    what_it_teaches,
)
from storage.experiments import State
from tests.playbooks.engines.vllm.recorded import json_file

KILLED = -signal.SIGKILL
OOM, FOR_MEMORY = Failure.out_of_memory, Failure.memory_refused
SGLANG: list[tuple[str, int | None, str, Failure]] = [
    # model_executor/pool_configurator.py, PoolConfig.__post_init__
    ("too low a fraction", KILLED,
     "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current "
     "value: mem_fraction_static=0.7\nReceived sigquit from a child process.", FOR_MEMORY),
    # mem_cache/kv_cache_configurator.py (rest_memory <= 0)
    ("weights leave no KV cache", KILLED,
     "ValueError: Loaded weights leave no GPU memory for the KV cache under "
     "--mem-fraction-static=0.7. Raise --mem-fraction-static above 0.780", FOR_MEMORY),
    # mem_cache/pool_host/base.py, HostKVCache.__init__
    ("host pool does not fit", KILLED,
     "ValueError: Not enough host memory available. Requesting 48.00 GB but only have 27.65 GB "
     "free. Please reduce the size of the hierarchical cache.", FOR_MEMORY),
    # mem_cache/hicache_auto_size.py
    ("no host RAM for the cache", KILLED,
     "ValueError: No host memory is left for HiCache after the 10 GiB reserve; set "
     "--hicache-ratio or --hicache-size explicitly.", FOR_MEMORY),
    ("CUDA out of memory under load", KILLED,
     "Scheduler hit an exception: Traceback (most recent call last):\n"
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
     "Received sigquit from a child process. It usually means the child failed.", OOM),
    ("the OOM killer", KILLED, "[2026-01-01 10:00:00] INFO:     Uvicorn running", OOM),
    ("a scheduler's other exception", KILLED,
     "Scheduler hit an exception: Traceback (most recent call last):\n"
     "AssertionError: page size does not divide the chunk\n"
     "Received sigquit from a child process. It usually means the child failed.",
     Failure.crashed),
    # recorded: `python -m sglang.launch_server --model-path x --hicache-size 40.0`, exit 2
    ("an argparse refusal", 2,
     "sglang serve: error: argument --hicache-size: invalid int value: '40.0'", Failure.refused),
    ("port in use", 1, "OSError: [Errno 98] error while attempting to bind on address: address "
     "already in use", Failure.crashed),
    ("a segfault", -signal.SIGSEGV, "[2026-01-01 10:00:00] Load weight begin.", Failure.crashed),
    ("an unknown status", 1, "bye", Failure.crashed),
    ("no status to read", None, "", Failure.unknown),
]  # fmt: skip

RECORDED_REFUSALS = {c["name"]: c for c in json_file("arg_checks.json")}
RUNTIME = {c["name"]: c for c in json_file("runtime_checks.json")}


def _runtime_log(name: str) -> str:
    run = RUNTIME[name]
    return "\n".join([*run["key_lines"], *run.get("log_tail", [])])


VLLM: list[tuple[str, int | None, str, Failure]] = [
    ("no KV cache blocks", 1,
     "ValueError: No available memory for the cache blocks. Try increasing "
     "gpu_memory_utilization when initializing the engine.\n"
     "RuntimeError: Engine core initialization failed. See root cause above.", FOR_MEMORY),
    ("one request does not fit", 1,
     "ValueError: To serve at least one request with the model's max seq len (32768), (4.00 GiB "
     "KV cache is needed, which is larger than the available KV cache memory (2.10 GiB). Based "
     "on the available memory, the estimated maximum model length is 17200.", FOR_MEMORY),
    ("less free than asked", 1,
     "ValueError: Free memory on device cuda:0 (60.1/139.8 GiB) on startup is less than desired "
     "GPU memory utilization (0.92, 128.6 GiB).", FOR_MEMORY),
    ("weights do not fit", 1,
     "Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization", OOM),
    ("CUDA out of memory", 1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", OOM),
    ("recorded: no KV cache at 0 bytes", 1, _runtime_log("kv_cache_memory_bytes_0"), FOR_MEMORY),
    ("recorded: 8 blocks hold no request", 1, _runtime_log("num_gpu_blocks_override_8"),
     FOR_MEMORY),
    ("recorded: the backend's block rule", 1, _runtime_log("block_size_7"), Failure.refused),
    ("recorded: argparse", 2, RECORDED_REFUSALS["kv_dtype_fp9"]["error"], Failure.refused),
    ("recorded: a range check", 1, RECORDED_REFUSALS["gpu_mem_util_1.5"]["error"],
     Failure.refused),
    ("recorded: max_num_seqs", 1, RECORDED_REFUSALS["batched_tokens_lt_seqs"]["error"],
     Failure.refused),
    ("the engine core, no cause", 1,
     "RuntimeError: Engine core initialization failed. See root cause above.", Failure.crashed),
    ("port in use", 1, "OSError: [Errno 98] Address already in use", Failure.crashed),
    ("the OOM killer", 128 + signal.SIGKILL, "INFO some line", OOM),
    ("an unknown status", 3, "INFO some line", Failure.crashed),
]  # fmt: skip

ROWS = [("sglang", *row) for row in SGLANG] + [("vllm", *row) for row in VLLM]


@pytest.mark.parametrize(
    ("engine", "name", "code", "log", "failure"), ROWS, ids=[f"{r[0]}: {r[1]}" for r in ROWS]
)
def test_what_an_exit_teaches(
    engine: str, name: str, code: int | None, log: str, failure: Failure
) -> None:
    cause = engine_named(engine).exit_cause(code, log)
    assert cause.failure == failure, (name, cause)
    assert cause.reason == engine_named(engine).classify_exit(code, log)
    memory = failure in (OOM, FOR_MEMORY)
    assert teaches_about_memory(cause.failure) is cause.memory is memory
    # the campaign's bound: only from memory evidence, at start or under load
    for how in ("failed_start", "died"):
        bounds = bound_from(
            {"mem_fraction_static": 0.88},
            {"mem_fraction_static": "0.85"},
            how,
            failure=cause.failure,
            reason="r",
        )
        assert [(b.key, b.limit, b.above) for b in bounds] == (
            [("mem_fraction_static", 0.88, True)] if memory else []
        )
    reason, details = exited("the changed server did not start", cause, cause.reason)
    assert failure_of(details) == failure
    assert reason.startswith(f"the changed server did not start: {cause.reason}")
    assert ("nothing was learnt about memory" in reason) is (not memory and failure != "refused")


@pytest.mark.parametrize(
    ("failure", "words"),
    [
        (Failure.out_of_memory, ""),
        (Failure.memory_refused, ""),
        (Failure.refused, "the engine refused its arguments, which says nothing about memory"),
        (Failure.crashed, "not an out-of-memory failure, so nothing was learnt about memory"),
        (Failure.timed_out, "not an out-of-memory failure, so nothing was learnt about memory"),
        (Failure.unknown, "not an out-of-memory failure, so nothing was learnt about memory"),
        (None, "not an out-of-memory failure, so nothing was learnt about memory"),
    ],
)
def test_what_it_teaches_is_said(failure: Failure | None, words: str) -> None:
    assert what_it_teaches(failure) == (f"; {words}" if words else "")
    assert teaches_about_memory(failure) is (not words)


def test_a_start_still_loading_teaches_nothing_and_says_what_to_raise() -> None:
    slow = StillLoading("gpu-1", 1843.2, 1800, known_ready_s=610.4)
    assert not teaches_about_memory(failure_of(slow.details()))
    assert slow.reason("restart") == (
        "the changed server was still loading after 1843 s (ready_timeout_s is 1800 s); the "
        "unchanged server took 610 s to become ready when kvpilot last started it; it was "
        "reverted, nothing was learnt about memory: raise `ready_timeout_s` in "
        "[servers.gpu-1.launcher] if the model takes longer to load"
    )
    assert StillLoading.from_details("gpu-1", slow.details()) == slow
    assert slow.reason("revert").startswith(
        "the revert failed: the last-known-good server was still loading after 1843 s "
        "(ready_timeout_s is 1800 s); a person must restore the server (raise "
        "`ready_timeout_s` in [servers.gpu-1.launcher]"
    )


def test_the_last_log_line_is_added_once_the_launcher_gave_up() -> None:
    slow = StillLoading("gpu-1", 1843.0, 1800)
    move = steps.Move(
        State.reverting, slow.reason("restart"), {"cause": "failed_start", **slow.details()}
    )
    log = "[10:00:00] Load weight begin. avail mem=95.30 GB\n[10:29:00] Loading safetensors 61%\n\n"
    given_up = steps.after_give_up(move, log, "gpu-1")
    assert "; its last log line: `[10:29:00] Loading safetensors 61%`; it was reverted" in (
        given_up.reason
    )
    assert given_up.details["last_line"] == "[10:29:00] Loading safetensors 61%"
    assert steps.after_give_up(move, "", "gpu-1") == move  # a launcher that reads no log
    died = steps.Move(State.reverting, "the changed server did not start: x", {"failure": "oom"})
    assert steps.after_give_up(died, log, "gpu-1") == died  # only a start given up
    assert last_log_line("x" * 400 + "\n") == "x" * 299 + "…"
