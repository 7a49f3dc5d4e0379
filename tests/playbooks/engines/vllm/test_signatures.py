"""Why a vLLM server went down, from its exit status and log lines.

The refusals of bad arguments are the real vLLM 0.32.0's own texts (`arg_checks.json`, recorded
with `.venv-vllm/bin/python tests/real_vllm/check_args.py --builtin`). The start-up failures of
the KV cache and GPU memory could not be provoked on this CPU-only machine: their texts are
vLLM 0.32's as shared/reference/vllm.md (sections 1.4 and 2.4) quotes them from its source.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest

from playbooks.engines import engine_named
from playbooks.engines.vllm.signatures import READY_LINE, classify_exit
from tests.playbooks.engines.vllm.recorded import REAL, json_file

CASES: dict[str, dict[str, Any]] = {c["name"]: c for c in json_file("arg_checks.json")}

# recorded case, the exit status vLLM gives such a refusal, words of the operator's sentence
RECORDED: list[tuple[str, int, str]] = [
    ("kv_dtype_fp9", 2, "vLLM refused its arguments: argument --kv-cache-dtype: invalid choice"),
    ("max_num_seqs_2.5", 2, "argument --max-num-seqs: invalid int value: '2.5'"),
    ("kv_bytes_1.5G", 2, "Decimals are not allowed"),
    ("swap_space_4", 2, "unrecognized arguments: --swap-space 4"),
    ("gpu_mem_util_1.5", 1, "outside its range: gpu_memory_utilization (CacheConfig)"),
    ("block_size_0", 1, "outside its range: block_size (CacheConfig)"),
    ("batched_tokens_lt_seqs", 1, "max_num_batched_tokens is below max_num_seqs"),
    ("max_num_seqs_4096", 1, "max_num_batched_tokens is below max_num_seqs"),
    ("no_chunked_prefill_batched_lt_model_len", 1, "must be at least max_model_len"),
    ("max_model_len_100000", 1, "longer than the model's own context length"),
]


@pytest.mark.parametrize(("case", "code", "words"), RECORDED)
def test_recorded_refusals(case: str, code: int, words: str) -> None:
    assert not CASES[case]["ok"]
    assert words in classify_exit(code, CASES[case]["error"])


FROM_SOURCE: list[tuple[str, str]] = [
    (
        "ValueError: No available memory for the cache blocks. Try increasing "
        "gpu_memory_utilization when initializing the engine.",
        "gpu_memory_utilization is too low",
    ),
    (
        "ValueError: To serve at least one request with the model's max seq len (32768), "
        "(4.00 GiB KV cache is needed, which is larger than the available KV cache memory "
        "(2.10 GiB). Based on the available memory, the estimated maximum model length is "
        "17200. Try increasing gpu_memory_utilization or decreasing max_model_len",
        "(vLLM estimates 17,200 tokens would fit): raise gpu_memory_utilization or lower",
    ),
    (
        "ValueError: Free memory on device cuda:0 (60.1/139.8 GiB) on startup is less than "
        "desired GPU memory utilization (0.92, 128.6 GiB). Decrease GPU memory utilization",
        "another process holds GPU memory",
    ),
    (
        "Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization",
        "the weights do not fit in GPU memory",
    ),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", "GPU out of memory"),
    (
        "RuntimeError: Engine core initialization failed. See root cause above.",
        "the engine core failed to start",
    ),
    ("OSError: [Errno 98] Address already in use", "the port is already in use"),
]


@pytest.mark.parametrize(("log", "words"), FROM_SOURCE)
def test_start_up_failures(log: str, words: str) -> None:
    assert words in classify_exit(1, log)


def test_the_cause_is_named_before_the_engine_cores_wrapper() -> None:
    log = (
        "ValueError: No available memory for the cache blocks.\n"
        "RuntimeError: Engine core initialization failed. See root cause above."
    )
    assert "gpu_memory_utilization is too low" in classify_exit(1, log)


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (-signal.SIGKILL, "OOM killer"),
        (128 + signal.SIGKILL, "OOM killer"),
        (None, "not running"),
        (3, "exited with status 3"),
    ],
)
def test_exit_statuses_without_a_line_of_their_own(code: int | None, words: str) -> None:
    assert words in classify_exit(code, "INFO some line\n")


def test_a_healthy_start_is_no_failure_and_the_seam_reaches_it() -> None:
    log = (REAL / "startup_log_default.txt").read_text()
    assert READY_LINE in log
    assert engine_named("vllm").classify_exit(0, log) == "exited with status 0"


RUNTIME = {c["name"]: c for c in json_file("runtime_checks.json")}


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("block_size_7", "the attention backend does not take this block_size"),
        ("kv_cache_memory_bytes_0", "leave no GPU memory for the KV cache"),
        # 8 blocks, one the null block: 896 tokens, as kvpilot counts a pool (test_capacity.py)
        ("num_gpu_blocks_override_8", "(vLLM estimates 896 tokens would fit)"),
    ],
)
def test_recorded_start_up_failures(case: str, words: str) -> None:
    run = RUNTIME[case]
    assert run["outcome"] == "exited"
    log = "\n".join([*run["key_lines"], *run.get("log_tail", [])])
    assert words in classify_exit(run["exit_code"], log)
