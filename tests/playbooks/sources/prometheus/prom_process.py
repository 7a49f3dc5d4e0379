"""Start a real Prometheus (Debian's package) on loopback that scrapes given targets.

Tests that need it call `prometheus_binary()`, which skips them with a reason when Prometheus is
not installed, unless KVPILOT_REQUIRE_PROMETHEUS=1 (set by CI), where its absence fails them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.ports import free_port

INSTALL_HINT = "apt-get install -y --no-install-recommends prometheus"


DEBIAN_PATH = Path("/usr/bin/prometheus")


def prometheus_binary() -> str:
    found = shutil.which("prometheus") or (str(DEBIAN_PATH) if DEBIAN_PATH.exists() else None)
    if found is not None:
        return found
    if os.environ.get("KVPILOT_REQUIRE_PROMETHEUS") == "1":
        pytest.fail(
            f"KVPILOT_REQUIRE_PROMETHEUS=1 but no prometheus binary is on PATH ({INSTALL_HINT})"
        )
    pytest.skip(f"Prometheus is not installed ({INSTALL_HINT}); CI requires it")


@dataclass
class PrometheusProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_series(self, expr: str, timeout: float = 20.0) -> None:
        """Until the query returns something (the first scrape of a target has landed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            response = httpx.get(self.url + "/api/v1/query", params={"query": expr}, timeout=5)
            if response.status_code == 200 and response.json()["data"]["result"]:
                return
            time.sleep(0.05)
        raise TimeoutError(f"Prometheus never returned {expr}:\n{self.log()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def write_config(path: Path, targets: list[str], scrape_interval: str) -> None:
    quoted = ", ".join(f'"{t}"' for t in targets)
    path.write_text(
        "global:\n"
        f"  scrape_interval: {scrape_interval}\n"
        f"  scrape_timeout: {scrape_interval}\n"
        "scrape_configs:\n"
        "  - job_name: sglang\n"
        "    static_configs:\n"
        f"      - targets: [{quoted}]\n"
    )


@contextmanager
def running_prometheus(
    workdir: Path,
    targets: list[str],
    scrape_interval: str = "100ms",
    prefix: Sequence[str] = (),
) -> Iterator[PrometheusProcess]:
    """Prometheus on a free loopback port with its own storage under `workdir`; `prefix` runs
    it under another command that execs it (a benchmark's `taskset`)."""
    binary = prometheus_binary()
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    write_config(config, targets, scrape_interval)
    port = free_port()
    log_path = workdir / "prometheus.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [
                *prefix,
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    prom = PrometheusProcess(proc, port, log_path)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"Prometheus exited with {proc.returncode}:\n{prom.log()}")
            try:
                if httpx.get(prom.url + "/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"Prometheus not ready after 30 s:\n{prom.log()[-3000:]}")
            time.sleep(0.05)
        yield prom
    finally:
        prom.stop()
