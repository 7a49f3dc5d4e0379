"""What vLLM's exit status and log lines mean, for the operator reading why a server is down.

The phrases are vLLM's own (0.32; the source of each is next to it), most specific first: the
engine core logs its exception and the API server then fails with "Engine core initialization
failed", so the cause is matched before that wrapper. A refusal by the argument parser exits 2
with `vllm serve: error: argument --FLAG: ...`; one by a config's range check exits 1 with a
pydantic `ValidationError`. A server that died without a line of its own is judged by its exit
status (a SIGKILL with no error is most likely the kernel's OOM killer). Each reading also says
what kind of failure it is (`playbooks.engines.exits.Failure`): only an out-of-memory signature
and vLLM's own refusals for memory are evidence about memory.
"""

from __future__ import annotations

import re
import signal

from playbooks.engines.exits import ExitCause, Failure

FAILURE_PATTERNS: list[tuple[str, Failure, str]] = [
    # `_check_enough_kv_cache_memory`, checked per worker after the null block is reserved
    (
        "No available memory for the cache blocks",
        Failure.memory_refused,
        "the weights, activations and CUDA graphs leave no GPU memory for the KV cache: "
        "gpu_memory_utilization is too low for this model",
    ),
    (
        "Cannot auto-fit max_model_len",
        Failure.memory_refused,
        "not even one token of KV cache fits (max_model_len auto): gpu_memory_utilization is "
        "too low for this model",
    ),
    # v1/worker/utils.py:761-770
    (
        "is less than desired GPU memory utilization",
        Failure.memory_refused,
        "less GPU memory was free at start-up than gpu_memory_utilization asks for (another "
        "process holds GPU memory, or the old server had not let go yet): lower "
        "gpu_memory_utilization or free the GPU",
    ),
    # v1/worker/utils.py `select_common_block_size`: the attention backend's own block rule
    # (recorded: "No common block size for 7 (CPU_ATTN: [MultipleOf(32)])")
    (
        "No common block size for",
        Failure.refused,
        "the attention backend does not take this block_size (see its rule in the log): pick "
        "one it supports",
    ),
    # gpu_model_runner.py:5139
    (
        "Failed to load model - not enough GPU memory",
        Failure.out_of_memory,
        "the weights do not fit in GPU memory: more tensor parallelism or a quantized model",
    ),
    # config/model.py:2645-2665
    (
        "User-specified max_model_len",
        Failure.refused,
        "max_model_len is longer than the model's own context length: vLLM refuses it",
    ),
    # config/scheduler.py:319 and :328
    (
        "must be greater than or equal to max_num_seqs",
        Failure.refused,
        "max_num_batched_tokens is below max_num_seqs: vLLM refuses it",
    ),
    (
        "is smaller than max_model_len",
        Failure.refused,
        "with chunked prefill off, max_num_batched_tokens must be at least max_model_len",
    ),
    (
        "CUDA out of memory",
        Failure.out_of_memory,
        "GPU out of memory (activations or CUDA graphs did not fit)",
    ),
    ("OutOfMemoryError", Failure.out_of_memory, "GPU out of memory"),
    ("Address already in use", Failure.crashed, "the port is already in use"),
    ("address already in use", Failure.crashed, "the port is already in use"),
]
# `_check_enough_kv_cache_memory`: "... Based on the available memory, the estimated maximum model
# length is N. Try increasing gpu_memory_utilization ... or decreasing max_model_len ..."
TOO_LONG = re.compile(r"estimated maximum model length is (\d+)")
# utils/argparse_utils.py `FlexibleArgumentParser.error`: "vllm serve: error: argument --F: ..."
PARSER_ERROR = re.compile(r"error: (argument (--[\w-]+)[^:]*: .+|unrecognized arguments: .+)")
VALIDATION = re.compile(r"validation error[s]? for (\w+)\s*\n\s*(\w+)", re.IGNORECASE)
ENGINE_FAILED = "Engine core initialization failed"  # v1/engine/utils.py:1431
READY_LINE = "Application startup complete."  # uvicorn, once routes are served


def _too_long(log_tail: str) -> str | None:
    match = TOO_LONG.search(log_tail)
    if match is None and "max seq len" not in log_tail:
        return None
    fits = f" (vLLM estimates {int(match.group(1)):,} tokens would fit)" if match else ""
    return (
        "one request of the full max_model_len needs more KV cache than fits"
        f"{fits}: raise gpu_memory_utilization or lower max_model_len"
    )


def _refused(log_tail: str) -> str | None:
    match = PARSER_ERROR.search(log_tail)
    if match is not None:
        return f"vLLM refused its arguments: {match.group(1).strip()}"
    found = VALIDATION.search(log_tail)
    if found is not None:
        return f"vLLM refused a value outside its range: {found.group(2)} ({found.group(1)})"
    return None


def exit_cause(code: int | None, log_tail: str) -> ExitCause:
    for needle, failure, meaning in FAILURE_PATTERNS:
        if needle in log_tail:
            return ExitCause(failure, meaning)
    too_long = _too_long(log_tail)
    if too_long is not None:  # not one request's KV cache fits: a refusal for memory
        return ExitCause(Failure.memory_refused, too_long)
    refused = _refused(log_tail)
    if refused is not None:
        return ExitCause(Failure.refused, refused)
    if ENGINE_FAILED in log_tail:
        return ExitCause(
            Failure.crashed,
            "the engine core failed to start (its error is in the log above that line)",
        )
    if code == -signal.SIGKILL or code == 128 + signal.SIGKILL:
        return ExitCause(
            Failure.out_of_memory,
            "killed by SIGKILL with no error of its own: most likely the kernel's OOM killer "
            "(host RAM overcommitted, e.g. by a KV offloading buffer)",
        )
    if code is None:
        return ExitCause(Failure.unknown, "not running")
    return ExitCause(Failure.crashed, f"exited with status {code}")


def classify_exit(code: int | None, log_tail: str) -> str:
    """The operator's sentence alone."""
    return exit_cause(code, log_tail).reason
