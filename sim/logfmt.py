"""SGLang's log lines, per dialect, with timestamps on the simulated clock.

Format: ``[%Y-%m-%d %H:%M:%S{prefix}] message`` where the prefix is `` DP{n}`` / `` TP{n}`` when
those sizes exceed one (scheduler lines come from TP rank 0).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TextIO

from sim.engine import DecodeStats, PrefillStats
from sim.version import SGLangVersion


class SimLog:
    """Writes SGLang-formatted lines to a stream; the clock gives simulated seconds."""

    def __init__(
        self,
        origin: datetime,
        sim_seconds: Callable[[], float],
        stream: TextIO | None = None,
    ) -> None:
        self.origin = origin
        self.sim_seconds = sim_seconds
        self.stream = stream or sys.stderr
        self._lock = threading.Lock()

    def timestamp(self, at: float | None = None) -> str:
        t = self.sim_seconds() if at is None else at
        return (self.origin + timedelta(seconds=t)).strftime("%Y-%m-%d %H:%M:%S")

    def line(self, message: str, prefix: str = "", at: float | None = None) -> None:
        text = f"[{self.timestamp(at)}{prefix}] {message}\n"
        with self._lock:
            self.stream.write(text)
            self.stream.flush()


def rank_prefix(tp_size: int, dp_size: int, dp_rank: int = 0) -> str:
    prefix = ""
    if dp_size > 1:
        prefix += f" DP{dp_rank}"
    if tp_size > 1 or dp_size > 1:
        prefix += " TP0"
    return prefix


def graph_label(device: str) -> str:
    return "cpu graph" if device == "cpu" else "cuda graph"


def prefill_line(v: SGLangVersion, s: PrefillStats, device: str = "cuda") -> str:
    msg = (
        f"Prefill batch, #new-seq: {s.new_seq}, #new-token: {s.new_tokens}, "
        f"#cached-token: {s.cached_tokens}, token usage: {s.token_usage:.2f}, "
        f"#running-req: {s.running}, #queue-req: {s.queued}, "
    )
    if v.refactored:
        msg += f"#pending-token: {s.pending_tokens}, "
    if v.new_endpoints:
        throughput = s.new_tokens / s.duration if s.duration > 0 else 0.0
        msg += f"{graph_label(device)}: False, input throughput (token/s): {throughput:.2f}"
    return msg


def decode_line(v: SGLangVersion, s: DecodeStats, device: str = "cuda") -> str:
    graphs = "False" if device == "cpu" else "True"
    msg = (
        f"Decode batch, #running-req: {s.running}, #token: {s.used_tokens}, "
        f"token usage: {s.token_usage:.2f}, {graph_label(device)}: {graphs}, "
        f"gen throughput (token/s): {s.gen_throughput:.2f}, #queue-req: {s.queued}"
    )
    return msg if v.new_endpoints else msg + ", "


def retract_line(count: int, old: float, new: float, gained: int, v: SGLangVersion) -> str:
    msg = (
        f"KV cache pool is full. Retract requests. #retracted_reqs: {count}, "
        f"#new_token_ratio: {old:.4f} -> {new:.4f}"
    )
    if v.refactored:
        msg += f", #new_tokens_gained: {gained}"
    return msg
