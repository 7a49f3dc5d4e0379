"""Start and stop real twin processes on loopback for tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.ports import free_port

REPO = Path(__file__).resolve().parent.parent


@dataclass
class TwinProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_exit(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def spawn(args: list[str], port: int | None = None) -> TwinProcess:
    port = port or free_port()
    log = Path(tempfile.mkstemp(prefix="twin-", suffix=".log")[1])
    cmd = [sys.executable, "-m", "sim.launch_server", "--port", str(port), *args]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return TwinProcess(proc, port, log)


def wait_healthy(twin: TwinProcess, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if twin.proc.poll() is not None:
            raise RuntimeError(f"twin exited with {twin.proc.returncode}:\n{twin.log()[-3000:]}")
        try:
            if httpx.get(twin.url + "/health", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    twin.stop()
    raise TimeoutError(f"twin not healthy after {timeout}s:\n{twin.log()[-3000:]}")


@contextmanager
def running_twin(args: list[str], timeout: float = 30.0) -> Iterator[TwinProcess]:
    twin = spawn(args)
    try:
        wait_healthy(twin, timeout)
        yield twin
    finally:
        twin.stop()
        twin.log_path.unlink(missing_ok=True)
