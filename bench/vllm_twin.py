"""How fast the vLLM twin simulates, with and without its quiet stretches.

    python -m bench.vllm_twin [--duration 300] [--serve-s 20]

In-process: `make demo ENGINE=vllm`'s load (Llama-3.1-8B on an H100 at
`--gpu-memory-utilization 0.35 --max-model-len 32768 --max-num-seqs 64`, 96 clients of the
`incident` profile) for `--duration` simulated seconds, stepping one step at a time and with
quiet stretches; prints simulated seconds per CPU second and the steps taken. Served: the twin as
a process at 20x and at 100x for `--serve-s` wall seconds, with the share of a core it used and
whether it fell behind its clock.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sim.models import LLAMA_3_1_8B, write_model_dir
from sim.request import Request
from sim.vllm.args import resolve
from sim.vllm.memory import plan_kv
from sim.vllm.runtime import scheduler_config
from sim.vllm.scheduler import Scheduler
from sim.workload import make_profile
from tests.ports import free_port

ARGS = [
    "--preset", "llama-3.1-8b-h100", "--gpu-memory-utilization", "0.35",
    "--max-model-len", "32768", "--max-num-seqs", "64",
]  # fmt: skip
CLIENTS = 96


def in_process(duration: float, stretches: bool) -> tuple[float, int, int]:
    """(CPU seconds, scheduler steps, calls of `step`) for `duration` simulated seconds."""
    cfg = resolve([*ARGS, "--seed", "7"])
    sched = Scheduler(scheduler_config(cfg, plan_kv(cfg)))
    profile = make_profile("incident", 7)

    def next_request(user: int) -> None:
        spec = profile.next_request(user)
        out = min(spec.max_new_tokens, cfg.max_model_len - len(spec.input_ids))
        req = Request(f"u{user}-{sched.steps}", spec.input_ids, out, sched.now)
        req.on_finish = lambda r, user=user: next_request(user)
        sched.submit(req)

    for user in range(CLIENTS):
        next_request(user)
    horizon = duration if stretches else -math.inf
    calls = 0
    start = time.process_time()
    while sched.now < duration and sched.step(horizon):
        calls += 1
    return time.process_time() - start, sched.steps, calls


def served(scale: int, seconds: float) -> tuple[float, bool]:
    """(share of a core, fell behind) of the twin serving the load at `scale` for `seconds`."""
    with tempfile.TemporaryDirectory() as tmp:
        model = write_model_dir(LLAMA_3_1_8B, Path(tmp) / "llama")
        log = Path(tmp) / "twin.log"
        command = [
            sys.executable, "-m", "sim.vllm", "serve", str(model), *ARGS,
            "--port", str(free_port()), "--time-scale", str(scale),
            "--workload", "incident", "--concurrency", str(CLIENTS), "--seed", "7",
        ]  # fmt: skip
        with log.open("wb") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        try:
            time.sleep(5)  # imports and start-up, not counted
            before = cpu_seconds(proc.pid)
            time.sleep(seconds)
            share = (cpu_seconds(proc.pid) - before) / seconds
        finally:
            proc.terminate()
            proc.wait(10)
        return share, "cannot keep up" in log.read_text()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = 100.0  # os.sysconf("SC_CLK_TCK") on Linux
    return (int(fields[11]) + int(fields[12])) / ticks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--duration", type=float, default=300.0)
    p.add_argument("--serve-s", type=float, default=20.0)
    a = p.parse_args()
    for stretches in (False, True):
        cpu, steps, calls = in_process(a.duration, stretches)
        mode = "quiet stretches" if stretches else "one step at a time"
        print(
            f"in process, {mode}: {a.duration / cpu:,.0f} simulated s per CPU s "
            f"({cpu:.2f} s for {a.duration:g} s; {steps:,} steps in {calls:,} calls)"
        )
    for scale in (20, 100):
        share, behind = served(scale, a.serve_s)
        print(
            f"served at {scale}x for {a.serve_s:g} s: {share:.0%} of a core"
            + ("; fell behind its clock" if behind else "; kept up with its clock")
        )


if __name__ == "__main__":
    main()
