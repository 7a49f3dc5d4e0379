"""What SGLang's exit status and log lines mean, for the operator reading why a server is down.

The phrases are SGLang's own log lines (0.5.23; the source of each is next to it), most specific
first; a server that died without one is judged by its exit status (a SIGKILL with no error of
its own is most likely the OOM killer). Each reading also says what kind of failure it is
(`playbooks.engines.exits.Failure`): only an out-of-memory signature and SGLang's own refusals
for memory are evidence about memory.
"""

from __future__ import annotations

import re
import signal

from playbooks.engines.exits import ExitCause, Failure

TOO_LOW = "the weights leave no GPU memory for the KV cache: mem_fraction_static is too low"
FAILURE_PATTERNS: list[tuple[str, Failure, str]] = [
    # mem_cache/pool_host/base.py `HostKVCache.__init__`
    (
        "Not enough host memory available",
        Failure.memory_refused,
        "the hierarchical cache's host pool does not fit in host RAM",
    ),
    # mem_cache/hicache_auto_size.py
    (
        "No host memory is left for HiCache",
        Failure.memory_refused,
        "no host RAM is left for the hierarchical cache",
    ),
    # model_executor/pool_configurator.py `__post_init__` (max_total_num_tokens <= 0)
    (
        "Not enough memory. Please try to increase --mem-fraction-static",
        Failure.memory_refused,
        TOO_LOW,
    ),
    # mem_cache/kv_cache_configurator.py (rest_memory <= 0)
    ("Loaded weights leave no GPU memory for the KV cache", Failure.memory_refused, TOO_LOW),
    (
        "CUDA out of memory",
        Failure.out_of_memory,
        "GPU out of memory (activations or CUDA graphs did not fit: "
        "mem_fraction_static too high for this load)",
    ),
    ("OutOfMemoryError", Failure.out_of_memory, "GPU out of memory"),
    ("Address already in use", Failure.crashed, "the port is already in use"),
    ("address already in use", Failure.crashed, "the port is already in use"),
]
# argparse's refusal, exit 2 (recorded from 0.5.23:
# "sglang serve: error: argument --hicache-size: invalid int value: '40.0'")
PARSER_ERROR = re.compile(r"error: (argument --[\w-]+[^:]*: .+|unrecognized arguments: .+)")
READY_LINE = "The server is fired up and ready to roll!"


def exit_cause(code: int | None, log_tail: str) -> ExitCause:
    for needle, failure, meaning in FAILURE_PATTERNS:
        if needle in log_tail:
            return ExitCause(failure, meaning)
    refused = PARSER_ERROR.search(log_tail)
    if refused is not None:
        return ExitCause(
            Failure.refused, f"SGLang refused its arguments: {refused.group(1).strip()}"
        )
    if code == -signal.SIGKILL or code == 128 + signal.SIGKILL:
        if (
            "Received sigquit from a child process" in log_tail
            or "Scheduler hit an exception" in log_tail
        ):
            return ExitCause(Failure.crashed, "a scheduler process failed (see the log)")
        return ExitCause(
            Failure.out_of_memory,
            "killed by SIGKILL with no error of its own: most likely the kernel's OOM killer "
            "(host RAM overcommitted, e.g. by the hierarchical cache's pinned host pool)",
        )
    if code is None:
        return ExitCause(Failure.unknown, "not running")
    return ExitCause(Failure.crashed, f"exited with status {code}")


def classify_exit(code: int | None, log_tail: str) -> str:
    """The operator's sentence alone."""
    return exit_cause(code, log_tail).reason
