"""`make demo`: the whole mission on embedded defaults, in a few minutes, on any machine.

It writes `demo/kvpilot.toml` for the SGLang twin running the incident (Kimi-K2.5 on 8 GPUs,
150 clients, mem-fraction-static 0.85) at 200x speed, starts the twin through the process
launcher, and runs the terminal front end: the diagnosis, the proposals with their verdicts,
an approval, the experiment with its progress and verdict, and the daily report with its chart.
In a terminal it asks before acting. Without one (or with --yes) it gives the console the
explicit `--yes` and says so: the demo acts only on the twin it started itself, whereas
`kvpilot console` without a terminal and without `--yes` refuses to choose. It always stops
what it started, and leaves `demo/` (database, logs, charts) to explore.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import TextIO

from bot.app.config import load
from bot.console.terminal import Console
from playbooks.engines import default_engine

SCALE = 200
PRESET = "kimi-k2.5-rtxpro6000-tp8"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(workdir: Path, port: int) -> Path:
    twin = [
        sys.executable, "-m", "sim.launch_server", "--preset", PRESET, "--port", str(port),
        "--time-scale", str(SCALE), "--workload", "incident", "--concurrency", "150",
        "--seed", "7",
    ]  # fmt: skip
    # The incident's settings, spelt by the engine the twin stands in for.
    command = twin + default_engine().spell({"mem_fraction_static": 0.85, "enable_metrics": True})
    path = workdir / "kvpilot.toml"
    path.write_text(
        "# Written by `make demo`: the SGLang twin running the incident at 200x speed.\n"
        "[kvpilot]\n"
        'database = "kvpilot.db"\n'
        'state_dir = "state"\n'
        f"time_scale = {SCALE}\n\n"
        "[gate]\nscrape_s = 10\nbatch_s = 60\n\n"
        "[sampler]\ninterval_s = 60\n\n"
        "[servers.incident]\n"
        f'url = "http://127.0.0.1:{port}"\n'
        "gpu_memory_gib = 95.59   # free memory per GPU before the weights (RTX PRO 6000)\n"
        "host_ram_gib = 256\n"
        "[servers.incident.launcher]\n"
        'kind = "process"\n'
        f"command = {json.dumps(command)}\n"
    )
    return path


def banner(out: TextIO, text: str) -> None:
    out.write("\n" + "#" * 78 + "\n# " + text + "\n" + "#" * 78 + "\n")
    out.flush()


def run(workdir: Path, out: TextIO, stdin: TextIO, auto: str | None) -> int:
    """`auto`: why the console approves what kvpilot recommends (None: it asks in the terminal)."""
    from bot.cli import main as kvpilot  # noqa: PLC0415 - the CLI imports the whole bot

    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    path = write_config(workdir, free_port())
    started = time.monotonic()
    banner(out, "kvpilot demo: the SGLang twin runs the incident at 200x speed")
    out.write(
        "Kimi-K2.5 on 8 GPUs with mem_fraction_static 0.85 and 150 clients: the KV cache\n"
        "holds ~116K tokens, so ~50 requests run and ~100 wait. kvpilot diagnoses it, proposes\n"
        "changes, and (once approved) tests the recommended one: keep it only if throughput\n"
        f"really improves, else revert. Configuration: {path}\n"
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
        console.kv.close()
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
    ns = p.parse_args(argv)
    auto = "--yes" if ns.yes else None if sys.stdin.isatty() else "no terminal"
    return run(Path(ns.dir), sys.stdout, sys.stdin, auto)


if __name__ == "__main__":
    raise SystemExit(main())
