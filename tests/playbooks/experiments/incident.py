"""The incident twin behind kvpilot's process launcher, for the experiment tests on the twin."""

from __future__ import annotations

import io
import json
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bot.cli import main
from playbooks.launchers.procfs import process_start_ticks
from tests.ports import free_port

SCALE = 200
# A test whose outcome needs the gate to *judge* a change measures at half that speed: at 200x
# two twins on two cores fall behind their clocks and the bot's scrapes come ~50 simulated
# seconds apart, too sparse and too skewed to show a +20% effect reliably, and a loaded machine
# can leave the baseline with fewer complete 60 s batches than the gate needs (it then reverts
# as "cannot judge", not as "not improved"); at 100x they come every 10-15 s. A revert after a
# failure needs no such evidence, so the others stay fast.
MEASURING_SCALE = 100
KEEPS = (
    "test_raising_the_fraction_is_kept",
    "test_harmful_host_cache_is_reverted",
    "anywhere",
    "counts_only_what_it_read",
)


def scale_for(test_name: str) -> int:
    return MEASURING_SCALE if any(k in test_name for k in KEEPS) else SCALE


@dataclass(frozen=True)
class Shape:
    """The twin's model and GPUs (a preset), the fraction it starts at, and the GPU memory
    kvpilot is told of (nvidia-smi's total)."""

    preset: str
    fraction: float
    gpu_memory_gib: float


INCIDENT = Shape("kimi-k2.5-rtxpro6000-tp8", 0.85, 95.59)
# The first real-GPU run's shape: Llama-3.1-8B on one H100 at a low fraction, where 150
# clients queue (40 running, 110 waiting on the twin) until a raise to 0.82 runs them all.
LOW_FRACTION_H100 = Shape("llama-3.1-8b-h100", 0.40, 79.65)
# The twin's simulated start-up for these tests: the Kimi preset's 480 s (a 547 GB model) is
# 4.8 s of every start and restart at 100x, and no test here is about how long a start takes
# (tests/playbooks/experiments/test_slow_start_twin.py is, with its own twin).
STARTUP_S = 60


@dataclass
class Workspace:
    config: Path
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def info(self) -> dict[str, Any]:
        return dict(httpx.get(self.url + "/server_info", timeout=10).json())

    def cli(self, *args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = main(
            [*args[:1], *args[1:], "--config", str(self.config)]
            if args[0] != "experiments"
            else [*args, "--config", str(self.config)],
            out=out,
            err=err,
        )
        return code, out.getvalue(), err.getvalue()


@contextmanager
def incident_workspace(
    tmp_path: Path,
    scale: int,
    gate: str = "",
    twin_flags: Sequence[str] = (),
    more_config: str = "",
    kvpilot: str = "",
    *,
    port: int | None = None,
    url: str | None = None,
    shape: Shape | None = None,
) -> Iterator[Workspace]:
    """The incident twin behind the process launcher, started, and its kvpilot.toml (`gate`:
    more `[gate]` lines; `twin_flags`: more twin arguments; `more_config`: tables after the
    server's; `kvpilot`: more `[kvpilot]` lines; `port`: the twin's, `url`: where kvpilot
    reaches it, when something stands between them; `shape`: another model, GPU and
    fraction than the incident's, under the same clients)."""
    port = port or free_port()
    shape = shape or INCIDENT
    command = [
        sys.executable,
        "-m",
        "sim.launch_server",
        "--preset",
        shape.preset,
        "--port",
        str(port),
        "--mem-fraction-static",
        str(shape.fraction),
        "--enable-metrics",
        "--time-scale",
        str(scale),
        "--workload",
        "incident",
        "--concurrency",
        "150",
        *(() if "--sim-startup-s" in twin_flags else ("--sim-startup-s", str(STARTUP_S))),
        *twin_flags,
    ]
    config = tmp_path / "kvpilot.toml"
    config.write_text(
        f"[kvpilot]\ntime_scale = {scale}\n{kvpilot}\n[gate]\nscrape_s = 10\nbatch_s = 60\n{gate}\n"
        f'[servers.incident]\nurl = "{url or f"http://127.0.0.1:{port}"}"\n'
        f"gpu_memory_gib = {shape.gpu_memory_gib}\nhost_ram_gib = 256\n"
        '[servers.incident.launcher]\nkind = "process"\n'
        f"command = {json.dumps(command)}\n{more_config}"
    )
    w = Workspace(config, port)
    code, _, err = w.cli("server", "start", "--server", "incident")
    assert code == 0, err
    try:
        yield w
    finally:
        code, _, _ = w.cli("server", "stop", "--server", "incident")
        if code != 0:  # kvpilot could not (a test broke its database): nothing left running
            _kill_recorded(tmp_path / "var" / "state" / "incident.process.json")


def _kill_recorded(state_file: Path) -> None:
    """Kill the server process kvpilot's process launcher recorded, if it still runs (the same
    process: started when recorded, not another one holding its pid since)."""
    try:
        state = json.loads(state_file.read_text())
        pid = int(state["pid"])
        if process_start_ticks(pid) == state["proc_start"]:
            os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError, KeyError, TypeError):
        pass
