"""What SGLang's exit status and log lines mean, for the operator reading why a server is down.

The phrases are SGLang's own log lines, most specific first; a server that died without one is
judged by its exit status (a SIGKILL with no error of its own is most likely the OOM killer).
"""

from __future__ import annotations

import signal

FAILURE_PATTERNS: list[tuple[str, str]] = [
    (
        "Not enough host memory available",
        "the hierarchical cache's host pool does not fit in host RAM",
    ),
    ("No host memory is left for HiCache", "no host RAM is left for the hierarchical cache"),
    (
        "Not enough memory. Please try to increase --mem-fraction-static",
        "the weights leave no GPU memory for the KV cache: mem_fraction_static is too low",
    ),
    (
        "Loaded weights leave no GPU memory for the KV cache",
        "the weights leave no GPU memory for the KV cache: mem_fraction_static is too low",
    ),
    (
        "CUDA out of memory",
        "GPU out of memory (activations or CUDA graphs did not fit: "
        "mem_fraction_static too high for this load)",
    ),
    ("OutOfMemoryError", "GPU out of memory"),
    ("Address already in use", "the port is already in use"),
    ("address already in use", "the port is already in use"),
]
READY_LINE = "The server is fired up and ready to roll!"


def classify_exit(code: int | None, log_tail: str) -> str:
    for needle, meaning in FAILURE_PATTERNS:
        if needle in log_tail:
            return meaning
    if code == -signal.SIGKILL or code == 128 + signal.SIGKILL:
        if (
            "Received sigquit from a child process" in log_tail
            or "Scheduler hit an exception" in log_tail
        ):
            return "a scheduler process failed (see the log)"
        return (
            "killed by SIGKILL with no error of its own: most likely the kernel's OOM killer "
            "(host RAM overcommitted, e.g. by the hierarchical cache's pinned host pool)"
        )
    if code is None:
        return "not running"
    return f"exited with status {code}"
