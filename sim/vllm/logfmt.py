"""vLLM's log lines on the simulated clock.

vllm/logger.py:28-33: ``(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s
[%(fileinfo)s:%(lineno)d] %(message)s`` with dates as ``%m-%d %H:%M:%S``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

from sim.logfmt import SimLog

# Where vLLM 0.32 logs each line (file:line of the logging call), as its format shows them.
SITE_ARGS = "api_utils.py:286"
SITE_VERSION = "api_utils.py:347"
SITE_MODEL_LOADING = "gpu_model_runner.py:5149"
SITE_AVAILABLE_KV = "gpu_worker.py:759"
SITE_OVERRIDE = "kv_cache_utils.py:2619"  # startup_log_capped.txt
SITE_KV_SIZE = "kv_cache_utils.py:2327"
SITE_INIT_ENGINE = "core.py:402"
SITE_ENGINE_FAILED = "core.py:1510"
SITE_START = "entry.py:140"
SITE_ROUTES_HEADER = "launcher.py:186"
SITE_ROUTE = "launcher.py:195"
SITE_STATS = "loggers.py:335"
SITE_DEV_MODE = "__init__.py:44"


# The start-up banner at api_utils.py:347, one log line per row: an empty row, the logo with
# "version V" and "model PATH" beside it, an empty row (tests/real_vllm/fixtures/
# startup_log_default.txt). Rows as recorded, trailing blanks kept.
LOGO_ROWS = (
    "       █     █     █▄   ▄█",
    " ▄▄ ▄█ █     █     █ ▀▄▀ █",
    "  █▄█▀ █     █     █     █",
    "   ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀",
)


def banner_rows(version: str, model: str) -> list[str]:
    r = LOGO_ROWS
    return ["", r[0], f"{r[1]}  version {version}", f"{r[2]}  model   {model}", r[3], ""]


class VllmLog(SimLog):
    """SimLog's stream, clock and lock with vLLM's layout; the API server and the engine core
    are one process here, told apart by the process name as in vLLM."""

    api_pid = os.getpid()
    engine_pid = os.getpid() + 1

    def timestamp(self, at: float | None = None) -> str:
        t = self.sim_seconds() if at is None else at
        return (self.origin + timedelta(seconds=t)).strftime("%m-%d %H:%M:%S")

    def emit(
        self,
        message: str,
        site: str,
        *,
        engine: bool = False,
        level: str = "INFO",
        at: float | None = None,
    ) -> None:
        proc = f"EngineCore pid={self.engine_pid}" if engine else f"APIServer pid={self.api_pid}"
        text = f"({proc}) {level} {self.timestamp(at)} [{site}] {message}\n"
        with self._lock:
            self.stream.write(text)
            self.stream.flush()


@dataclass
class IntervalStats:
    """One periodic log interval (LoggingStatLogger, vllm/v1/metrics/loggers.py:255-345)."""

    prompt_throughput: float
    generation_throughput: float
    running: int
    waiting: int
    preemptions: int  # in this interval; counted, never printed (see stats_line)
    kv_usage: float  # 0..1
    prefix_hit_rate: float | None  # None until prefix-cache stats exist


def stats_line(s: IntervalStats, engine_index: int = 0) -> str:
    parts = [
        f"Avg prompt throughput: {s.prompt_throughput:.1f} tokens/s",
        f"Avg generation throughput: {s.generation_throughput:.1f} tokens/s",
        f"Running: {s.running} reqs",
        f"Waiting: {s.waiting} reqs",
    ]
    # No "Preemptions: N": LoggingStatLogger.log() resets the interval's preemption count in
    # _update_stats() before testing it, so 0.32 never prints it (tests/real_vllm/README.md
    # "Differences" 2; none of the preempting load's lines in stats_log_lines.txt has it).
    parts.append(f"GPU KV cache usage: {s.kv_usage * 100:.1f}%")
    if s.prefix_hit_rate is not None:
        parts.append(f"Prefix cache hit rate: {s.prefix_hit_rate * 100:.1f}%")
    return f"Engine {engine_index:03d}: " + ", ".join(parts)
