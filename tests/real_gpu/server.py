"""One SGLang server on the GPU: its command line, start and stop, and what is read from it.

The server is started and torn down by the real-SGLang harness (`tests/real_sglang/harness.py`,
under its reaper, so nothing outlives a phase); between two servers the GPU's memory is waited
for until it is free again, or the next server would size its KV pool from what the last one
still held.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from playbooks.sources.gpu import GpuReader, GpuState, GpuUnavailable
from tests.real_sglang.harness import RealSGLang

GIB = 1 << 30
# What SGLang logs before it loads the weights: the free memory its sizing starts from.
_PRE_LOAD = re.compile(r"Load weight begin\. avail mem=([0-9.]+) GB")
GAUGES = (
    "sglang:max_total_num_tokens",
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:token_usage",
    "sglang:gen_throughput",
    "sglang:startup_available_gpu_memory_gb",
)


@dataclass
class Machine:
    """Where servers run and how: the GPU machine, or the twin standing in for it in tests."""

    python: str  # the interpreter of kvpilot's tools (and, on the GPU, of SGLang)
    server: Callable[[float, Sequence[str]], list[str]]  # (fraction, extra flags) -> command
    server_env: dict[str, str]
    tool_env: dict[str, str]  # kvpilot's command line and the load generator
    gpus: GpuReader
    logs: Path  # every log a phase writes, packed into logs.tar.xz
    local_gpus: bool = True  # kvpilot reads GPU memory with NVML (it runs on the GPU host)
    time_scale: float = 1.0  # the server's clock against the wall's (the twin's in tests)
    start_timeout_s: float = 300.0
    idle_used_gib: float = 2.0  # GPU memory in use that still counts as free of servers
    logs_written: int = 0

    def log_path(self, name: str) -> Path:
        """A new file under `logs`, numbered in the order the call wrote them."""
        self.logs_written += 1
        self.logs.mkdir(parents=True, exist_ok=True)
        return self.logs / f"{self.logs_written:02d}-{name}.log"

    def gpu(self) -> dict[str, Any] | None:
        """GPU 0's memory now (GiB), or None when it cannot be read."""
        try:
            states = self.gpus.snapshot()
        except GpuUnavailable:
            return None
        return gpu_json(states[0]) if states else None

    def wait_gpu_idle(self, timeout_s: float = 60.0) -> float | None:
        """Wait until GPU 0 holds no server's memory; the GiB still in use (None: unreadable)."""
        deadline = time.monotonic() + timeout_s
        while True:
            now = self.gpu()
            if now is None or now["used_gib"] <= self.idle_used_gib:
                return None if now is None else float(now["used_gib"])
            if time.monotonic() > deadline:
                return float(now["used_gib"])
            time.sleep(0.5)


def gpu_json(state: GpuState) -> dict[str, Any]:
    return {
        "name": state.name,
        "total_mib": state.memory_total_mib,
        "total_gib": round(state.memory_total_bytes / GIB, 3),
        "used_gib": round(state.memory_used_bytes / GIB, 3),
        "free_gib": round(state.memory_free_bytes / GIB, 3),
    }


class Server:
    """A started server; `stop()` keeps its log under the machine's logs."""

    def __init__(self, machine: Machine, real: RealSGLang, name: str) -> None:
        self.machine = machine
        self.real = real
        self.name = name
        self.url = real.url
        self.startup_s = real.startup_s

    @classmethod
    def start(
        cls,
        machine: Machine,
        port: int,
        fraction: float,
        extra: Sequence[str] = (),
        timeout_s: float | None = None,
    ) -> Server:
        name = re.sub(r"[^A-Za-z0-9._-]+", "-", "-".join([f"sglang-{fraction:g}", *extra]))
        real = RealSGLang.start(
            port,
            env=machine.server_env,
            timeout=machine.start_timeout_s if timeout_s is None else timeout_s,
            command=machine.server(fraction, extra),
        )
        return cls(machine, real, name[:60])

    def stop(self) -> dict[str, Any]:
        """Stop the server, keep its log, wait for the GPU's memory; what that took."""
        began = time.monotonic()
        slow: str | None = None
        for attempt in range(3):
            try:
                self.real.stop()
                break
            except RuntimeError as exc:  # a process still exiting (a GPU's memory released)
                slow = str(exc)
                time.sleep(5.0 * (attempt + 1))
        log = self.real.log_text()
        self.machine.log_path(self.name).write_text(log)
        still = self.machine.wait_gpu_idle()
        return {
            "stop_s": round(time.monotonic() - began, 1),
            "gpu_used_after_gib": still,
            "slow_exit": slow,
        }

    def pre_load_gib(self) -> float | None:
        """The free GPU memory SGLang logged before loading the weights."""
        found = _PRE_LOAD.findall(self.real.log_text())
        return float(found[0]) if found else None

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60.0)

    def server_info(self) -> dict[str, Any]:
        with self.client() as c:
            for path in ("/get_server_info", "/server_info"):
                resp = c.get(path)
                if resp.status_code == 200:
                    data = resp.json()
                    return data if isinstance(data, dict) else {"answer": data}
        raise RuntimeError(f"{self.url} answers neither /get_server_info nor /server_info")

    def metrics(self) -> dict[str, Any]:
        with self.client() as c:
            text = c.get("/metrics").text
        return metrics_summary(text)

    def generate(self, input_ids: Sequence[int], max_new_tokens: int) -> dict[str, Any]:
        body = {
            "input_ids": list(input_ids),
            "sampling_params": {
                "max_new_tokens": max_new_tokens,
                "ignore_eos": True,
                "temperature": 0,
            },
        }
        began = time.monotonic()
        with self.client() as c:
            resp = c.post("/generate", json=body)
        resp.raise_for_status()
        data = resp.json()
        meta = data.get("meta_info") or {}
        return {
            "seconds": round(time.monotonic() - began, 3),
            "completion_tokens": meta.get("completion_tokens"),
            "prompt_tokens": meta.get("prompt_tokens"),
            "text_chars": len(str(data.get("text", ""))),
            "text_start": str(data.get("text", ""))[:60],
        }


def metrics_summary(text: str) -> dict[str, Any]:
    """The metric families SGLang exports and the gauges the phases read."""
    families: list[str] = []
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("sglang:"):
            families.append(family.name)
        for sample in family.samples:
            if sample.name in GAUGES and sample.name not in values:
                values[sample.name] = float(sample.value)
    decode = decoded_tokens(text)
    return {
        "families": sorted(set(families)),
        "gauges": values,
        "decoded_tokens": decode,
    }


def decoded_tokens(text: str) -> float | None:
    """`sglang:realtime_tokens_total{mode="decode"}`, summed over its series, if exported."""
    total: float | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name.startswith("sglang:realtime_tokens")
                and sample.labels.get("mode") == "decode"
                and not sample.name.endswith("_created")
            ):
                total = (total or 0.0) + float(sample.value)
    return total
