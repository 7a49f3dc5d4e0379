"""Failure modes end the twin's process the way they end SGLang's."""

from __future__ import annotations

import signal
import subprocess
import sys

import httpx
import pytest

from tests.ports import free_port
from tests.twin_process import REPO, running_twin, spawn, wait_healthy

FAST = ["--time-scale", "2000", "--enable-metrics"]


def test_fraction_too_low_fails_at_startup() -> None:
    twin = spawn([*FAST, "--mem-fraction-static", "0.7"])
    code = twin.wait_exit(timeout=30)
    log = twin.log()
    assert code == -signal.SIGKILL
    assert "Load weight end." in log
    assert "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static." in log
    assert "Received sigquit from a child process. It usually means the child failed." in log
    assert "fired up" not in log


def test_fraction_too_low_message_in_0_5_23() -> None:
    twin = spawn([*FAST, "--mem-fraction-static", "0.7", "--sglang-version", "0.5.23"])
    twin.wait_exit(timeout=30)
    assert "Raise --mem-fraction-static above 0.78" in twin.log()


def test_0_93_starts_then_dies_under_load() -> None:
    twin = spawn(
        [*FAST, "--mem-fraction-static", "0.93", "--workload", "incident", "--concurrency", "150"]
    )
    code = twin.wait_exit(timeout=60)
    log = twin.log()
    assert "The server is fired up and ready to roll!" in log
    assert "torch.OutOfMemoryError: CUDA out of memory." in log
    assert code == -signal.SIGKILL


def test_hicache_48_refused_at_startup_when_checked_per_rank() -> None:
    twin = spawn(
        [
            *FAST,
            "--mem-fraction-static",
            "0.85",
            "--sglang-version",
            "0.5.23",
            "--enable-hierarchical-cache",
            "--hicache-size",
            "48",
        ]
    )
    code = twin.wait_exit(timeout=30)
    log = twin.log()
    assert code == -signal.SIGKILL
    assert (
        "ValueError: Not enough host memory available. Requesting 48.00 GB but only have "
        "27.65 GB free. Please reduce the size of the hierarchical cache."
    ) in log


def test_hicache_48_killed_by_host_oom_on_0_5_5() -> None:
    twin = spawn(
        [
            *FAST,
            "--mem-fraction-static",
            "0.85",
            "--sglang-version",
            "0.5.5",
            "--enable-hierarchical-cache",
            "--hicache-size",
            "48",
            "--workload",
            "incident",
            "--concurrency",
            "20",
        ]
    )
    code = twin.wait_exit(timeout=60)
    log = twin.log()
    assert "Allocating 48.00 GB host memory for hierarchical KV cache." in log
    assert code == -signal.SIGKILL
    # The kernel's OOM killer leaves no Python traceback behind. (The warm-up request is small
    # enough to touch no host pages; the first real batch does.)
    assert "Scheduler hit an exception" not in log


def test_hicache_default_ratio_runs_at_0_88() -> None:
    with running_twin(
        [
            *FAST,
            "--mem-fraction-static",
            "0.88",
            "--sglang-version",
            "0.5.5",
            "--enable-hierarchical-cache",
        ]
    ) as twin:
        info = httpx.get(twin.url + "/get_server_info").json()
        assert info["max_total_num_tokens"] == 159_856
        assert "Allocating 22.47 GB host memory for hierarchical KV cache." in twin.log()


def test_malformed_flag_exits_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sim.launch_server", "--mem-fraction-static", "lots"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "argument --mem-fraction-static: invalid" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_port_in_use_is_reported() -> None:
    port = free_port()
    with running_twin([*FAST]) as first:
        second = spawn([*FAST], port=first.port)
        code = second.wait_exit(timeout=30)
        assert code != 0
        assert "is the port in use" in second.log() or "address already in use" in second.log()
    del port


@pytest.mark.parametrize("version", ["0.5.5", "0.5.23"])
def test_startup_is_not_ready_until_warm(version: str) -> None:
    twin = spawn(["--time-scale", "400", "--sglang-version", version])
    try:
        wait_healthy(twin, timeout=30)
        log = twin.log()
        assert log.index("max_total_num_tokens=") < log.index("fired up and ready")
    finally:
        twin.stop()
