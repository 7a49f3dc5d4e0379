"""`make demo`: the whole mission on embedded defaults, in a few minutes, on any machine.

It writes `demo/kvpilot.toml` for the SGLang twin running the incident (Kimi-K2.5 on 8 GPUs,
150 clients, mem-fraction-static 0.85) at 200x speed, or with `--engine vllm` (`make demo
ENGINE=vllm`) for the vLLM twin running its like (Llama-3.1-8B on an H100 at
gpu-memory-utilization 0.35, 96 clients) at 100x, starts the twin through the process
launcher, and runs the terminal front end: the diagnosis, the proposals with their verdicts,
an approval, the experiment with its progress and verdict, and the daily report with its chart.
In a terminal it asks before acting. Without one (or with --yes) it gives the console the
explicit `--yes` and says so: the demo acts only on the twin it started itself, whereas
`kvpilot console` without a terminal and without `--yes` refuses to choose. It always stops
what it started, and leaves `demo/` (database, logs, charts) to explore.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import math
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from bot.app.config import load
from bot.console.terminal import Console
from playbooks.engines import engine_named


@dataclass(frozen=True)
class Scenario:
    """One engine's incident: its twin, the settings it starts with, and what the demo says."""

    engine: str
    scale: int
    twin: tuple[str, ...]  # the twin's module and its own flags (preset, workload)
    settings: dict[str, Any]  # the engine's own launch settings, spelt by the engine
    server: str  # the [servers.incident] lines besides url, engine and launcher
    title: str
    story: str
    gate: str = "scrape_s = 10\nbatch_s = 60\n"  # the [gate] lines
    model_dir: bool = False  # serve from a directory holding the preset's config.json


SCENARIOS = {
    "sglang": Scenario(
        engine="sglang",
        scale=200,
        twin=("sim.launch_server", "--preset", "kimi-k2.5-rtxpro6000-tp8", "--concurrency", "150"),
        settings={"mem_fraction_static": 0.85, "enable_metrics": True},
        server=(
            "gpu_memory_gib = 95.59   # free memory per GPU before the weights (RTX PRO 6000)\n"
            "host_ram_gib = 256\n"
        ),
        title="the SGLang twin runs the incident at 200x speed",
        story=(
            "Kimi-K2.5 on 8 GPUs with mem_fraction_static 0.85 and 150 clients: the KV cache\n"
            "holds ~116K tokens, so ~50 requests run and ~100 wait."
        ),
    ),
    "vllm": Scenario(
        engine="vllm",
        scale=100,
        twin=("sim.vllm", "serve", "--preset", "llama-3.1-8b-h100", "--concurrency", "96"),
        settings={"gpu_memory_utilization": 0.35, "max_model_len": 32768, "max_num_seqs": 64},
        server="gpu_memory_gib = 79.65   # the H100's total memory, the base of utilization\n",
        title="the vLLM twin runs an incident like it at 100x speed",
        story=(
            "Llama-3.1-8B on an H100 with gpu_memory_utilization 0.35 (left low from when it\n"
            "shared the GPU) and 96 clients: the KV cache holds ~40 requests, the rest wait\n"
            "and vLLM preempts."
        ),
        # half the default windows, as in the SGLang scenario's few minutes
        gate="scrape_s = 10\nbatch_s = 30\nbaseline_s = 300\nmax_trial_s = 900\n",
        model_dir=True,
    ),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(workdir: Path, port: int, scenario: Scenario = SCENARIOS["sglang"]) -> Path:
    module, *flags = scenario.twin
    twin = [sys.executable, "-m", module]
    if scenario.model_dir:  # `vllm serve DIR`, the directory kvpilot reads config.json from
        directory, preset = workdir / "models" / "llama", flags[flags.index("--preset") + 1]
        subprocess.run(
            [sys.executable, "-m", "sim.model_dir", preset, str(directory)],
            check=True,
            capture_output=True,
        )
        twin += [flags.pop(0), str(directory)]
    twin += [
        *flags, "--port", str(port), "--time-scale", str(scenario.scale),
        "--workload", "incident", "--seed", "7",
    ]  # fmt: skip
    # The incident's settings, spelt by the engine the twin stands in for.
    command = twin + engine_named(scenario.engine).spell(scenario.settings)
    path = workdir / "kvpilot.toml"
    path.write_text(
        f"# Written by `make demo`: {scenario.title}.\n"
        "[kvpilot]\n"
        'database = "kvpilot.db"\n'
        'state_dir = "state"\n'
        f"time_scale = {scenario.scale}\n\n"
        f"[gate]\n{scenario.gate}\n"
        "[sampler]\ninterval_s = 60\n\n"
        "[servers.incident]\n"
        f'url = "http://127.0.0.1:{port}"\n'
        f'engine = "{scenario.engine}"\n'
        f"{scenario.server}"
        "[servers.incident.launcher]\n"
        'kind = "process"\n'
        f"command = {json.dumps(command)}\n"
    )
    return path


def banner(out: TextIO, text: str) -> None:
    out.write("\n" + "#" * 78 + "\n# " + text + "\n" + "#" * 78 + "\n")
    out.flush()


def run(
    workdir: Path,
    out: TextIO,
    stdin: TextIO,
    auto: str | None,
    scenario: Scenario = SCENARIOS["sglang"],
) -> int:
    """`auto`: why the console approves what kvpilot recommends (None: it asks in the terminal)."""
    from bot.cli import main as kvpilot  # noqa: PLC0415 - the CLI imports the whole bot

    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    path = write_config(workdir, free_port(), scenario)
    started = time.monotonic()
    banner(out, f"kvpilot demo: {scenario.title}")
    out.write(
        f"{scenario.story}\nkvpilot diagnoses it, proposes changes, and (once approved) tests\n"
        "the recommended one: keep it only if throughput really improves, else revert.\n"
        f"Configuration: {path}\n"
    )
    err = io.StringIO()
    if kvpilot(["server", "start", "--server", "incident", "--config", str(path)], out, err):
        out.write(err.getvalue())
        return 1
    config = load(str(path))
    console = Console(config, out=out, stdin=stdin, auto=auto is not None)
    try:
        if auto is not None:
            out.write(
                f"({auto}: the demo runs the console with --yes, which approves what kvpilot "
                "recommends on the demo's own twin, and says so)\n"
            )
        console.start_background()
        began = console.clock.utcnow()
        banner(out, "1. Diagnose: measure the server and name its bottleneck")
        console.loop(["diagnose incident"])
        banner(out, "2. The daily report, over the (simulated) time the demo ran")
        minutes = math.ceil((console.clock.utcnow() - began).total_seconds() / 60)
        console.loop([f"report incident --since {minutes}m", "history"])
    finally:
        console.stop_background()
        kvpilot(["server", "stop", "--server", "incident", "--config", str(path)], out, err)
    charts = sorted(str(p) for p in console.surface.saved)
    banner(out, f"Done in {time.monotonic() - started:.0f} s")
    out.write(
        "Charts:   " + (", ".join(charts) or "none") + "\n"
        f"Database: {config.database} (the servers, proposals, experiments and audit log)\n"
        f"Explore:  .venv/bin/kvpilot experiments list --config {path}\n"
        f"          .venv/bin/kvpilot experiments show 1 --config {path}\n"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bot.console.demo", description=__doc__.split("\n")[0]
    )
    p.add_argument("--dir", default="demo", help="where the demo writes its files (replaced)")
    p.add_argument(
        "--yes", action="store_true", help="approve what kvpilot recommends without asking"
    )
    p.add_argument(
        "--engine", choices=sorted(SCENARIOS), default="sglang", help="whose twin runs the incident"
    )
    ns = p.parse_args(argv)
    if importlib.util.find_spec("sim") is None:
        sys.stderr.write(
            "error: the demo runs kvpilot's twin, which comes with the source, not with the "
            "installed package: run `make demo` in a checkout\n"
        )
        return 2
    auto = "--yes" if ns.yes else None if sys.stdin.isatty() else "no terminal"
    return run(Path(ns.dir), sys.stdout, sys.stdin, auto, SCENARIOS[ns.engine])


if __name__ == "__main__":
    raise SystemExit(main())
