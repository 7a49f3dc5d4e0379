"""`make demo`'s non-interactive path: the whole mission on embedded defaults."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import psutil
import pytest

from storage import experiments as store
from storage.db import open_db
from tests.twin_process import REPO

pytestmark = pytest.mark.slow


def test_demo_runs_end_to_end_and_leaves_nothing_running(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, "-m", "bot.console.demo", "--dir", str(workdir)],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    # The diagnosis: KV cache bound at ~116K tokens, ~50 running and ~100 queued.
    assert "kv cache bound" in out and "116,171" in out
    assert "requests ran and" in out and "waited" in out
    # The proposals with their verdicts, the unsafe one explained; the approval announced.
    assert "unsafe: `mem_fraction_static=0.93`" in out and "run out of GPU memory" in out
    assert "approves what kvpilot recommends" in out and "auto: Approve" in out
    # Progress, the verdict with numbers, the report and its chart.
    assert "baseline ->" in out and "Effect:" in out and "Baseline:" in out
    assert "kvpilot report: incident" in out and "Experiments" in out
    charts = sorted((workdir / "state" / "charts").glob("*.png"))
    assert len(charts) == 2 and all(p.read_bytes().startswith(b"\x89PNG") for p in charts)
    assert all(str(p) in out for p in charts)
    # The database stays for `kvpilot experiments list`; no server is left running.
    rows = store.list_experiments(open_db(workdir / "kvpilot.db"))
    assert len(rows) == 1 and rows[0].terminal
    port = tomllib.loads((workdir / "kvpilot.toml").read_text())["servers"]["incident"]["url"]
    port = port.rsplit(":", 1)[1]
    twins = [
        p
        for p in psutil.process_iter(["cmdline"])
        if "sim.launch_server" in (p.info["cmdline"] or []) and port in (p.info["cmdline"] or [])
    ]
    assert not twins


# Its baseline needs the twin's scrapes on time: beside the parallel tier on two cores they fell
# behind at 50x as well, so it runs in the serial tier.
@pytest.mark.serial
def test_the_vllm_demo_keeps_the_utilization_kvpilot_predicted(tmp_path: Path) -> None:
    """`make demo ENGINE=vllm`: the vLLM twin, diagnosed in vLLM's terms, the recommended
    utilization approved, kept, and the capacity the twin then reports is the predicted one."""
    workdir = tmp_path / "demo"
    done = subprocess.run(
        [sys.executable, "-m", "bot.console.demo", "--dir", str(workdir), "--engine", "vllm"],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=280,
    )
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert "vLLM 0.32.0" in out and "kv cache bound" in out and "preemptions" in out
    assert "gpu_memory_utilization=0.95" in out and "KV capacity 86,208 → 477,696" in out
    assert "capacity_tokens: 86,208 -> 477,696" in out  # what the twin reports after the restart
    rows = store.list_experiments(open_db(workdir / "kvpilot.db"))
    assert [r.state for r in rows] == ["kept"]
