"""A real Docker Engine for the tests: the one already running, or Debian's dockerd started on
a socket and data root of its own, as ../shared notes for our machines (no systemd as PID 1, no
iptables, no bridge: containers use the host's network), and stopped again afterwards.

Its PATH has a stand-in for NVIDIA's OCI prestart hook: dockerd 20.10 accepts a GPU device
request only when `nvidia-container-runtime-hook` is on its PATH (moby daemon/nvidia_linux.go
registers the "nvidia" device driver at start when it finds it, and runc calls it with
`prestart` before each such container starts). The stand-in accepts the call and gives no GPU,
so the create body production sends (device requests, IPC, shared memory) meets the real daemon.

Absent a daemon that can start, the tests skip with the reason, except where
KVPILOT_REQUIRE_DAEMONS=1 (CI), where they fail.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

INSTALL_HINT = "apt-get install -y --no-install-recommends docker.io"
HOOK = "nvidia-container-runtime-hook"
BASE_IMAGE = "kvpilot/empty:1"  # an empty root file system; the host's files are mounted in


def unavailable(reason: str) -> None:
    if os.environ.get("KVPILOT_REQUIRE_DAEMONS") == "1":
        pytest.fail(f"KVPILOT_REQUIRE_DAEMONS=1 but {reason}")
    pytest.skip(f"{reason}; CI requires it")


def answers(path: str) -> bool:
    if not listening(path):
        return False
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=path), timeout=3) as c:
            return c.get("http://docker/_ping").status_code == 200
    except (httpx.HTTPError, OSError):
        return False


def listening(path: str) -> bool:
    """Something accepts connections on the Unix socket `path` (checked first with a socket of
    our own, closed either way: httpcore leaves the one of a refused connection open)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


@dataclass
class Dockerd:
    socket: str
    proc: subprocess.Popen[bytes] | None  # None: a daemon that was already running
    root: Path | None

    def client(self) -> httpx.Client:
        return httpx.Client(
            transport=httpx.HTTPTransport(uds=self.socket),
            base_url="http://docker/v1.41",
            timeout=60,
        )

    def gpu_ready(self) -> bool:
        """Whether this daemon accepts a GPU device request (the hook is on its PATH)."""
        return self.proc is not None or shutil.which(HOOK) is not None


def import_base(d: Dockerd) -> None:
    """`docker import` of an empty root file system, once."""
    with d.client() as c:
        if c.get(f"/images/{BASE_IMAGE}/json").status_code == 200:
            return
        data = io.BytesIO()
        with tarfile.open(fileobj=data, mode="w") as tar:
            info = tarfile.TarInfo("tmp")
            info.type, info.mode = tarfile.DIRTYPE, 0o1777
            tar.addfile(info)
        repo, tag = BASE_IMAGE.split(":")
        r = c.post(
            "/images/create",
            params={"fromSrc": "-", "repo": repo, "tag": tag},
            content=data.getvalue(),
            headers={"Content-Type": "application/x-tar"},
        )
        assert r.status_code == 200, r.text


@contextmanager
def running_dockerd() -> Iterator[Dockerd]:
    given = os.environ.get("KVPILOT_DOCKER_SOCKET")
    if given:
        if not answers(given):
            unavailable(f"no Docker Engine answers on KVPILOT_DOCKER_SOCKET={given}")
        d = Dockerd(given, None, None)
        import_base(d)
        yield d
        return
    binary = shutil.which("dockerd")
    if binary is None:
        unavailable(f"dockerd is not installed ({INSTALL_HINT})")
        raise AssertionError  # unreachable: skip and fail raise
    if os.geteuid() != 0:
        unavailable("dockerd needs root")
    root = Path(tempfile.mkdtemp(prefix="kvd-"))  # short: a socket path holds 107 bytes
    hooks = root / "bin"
    hooks.mkdir()
    (hooks / HOOK).write_text("#!/bin/sh\n# stand-in: accepts the prestart call, gives no GPU\n"
                              "cat >/dev/null\nexit 0\n")  # fmt: skip
    (hooks / HOOK).chmod(0o755)
    address = str(root / "docker.sock")
    log = (root / "dockerd.log").open("wb")
    proc = subprocess.Popen(
        [
            binary, "--iptables=false", "--ip-masq=false", "--bridge=none",
            f"--host=unix://{address}", f"--data-root={root / 'data'}",
            f"--exec-root={root / 'exec'}", f"--pidfile={root / 'dockerd.pid'}",
        ],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "PATH": f"{hooks}:{os.environ.get('PATH', '/usr/bin:/bin')}"},
    )  # fmt: skip
    log.close()
    d = Dockerd(address, proc, root)
    try:
        deadline = time.monotonic() + 60
        while not answers(address):
            if proc.poll() is not None or time.monotonic() > deadline:
                text = (root / "dockerd.log").read_text(errors="replace")[-3000:]
                unavailable(f"dockerd did not start:\n{text}")
            time.sleep(0.2)
        import_base(d)
        yield d
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        for mounted in ("exec/netns/default", "exec", "data"):  # what dockerd may leave mounted
            subprocess.run(
                ["umount", "-R", "-l", str(root / mounted)], capture_output=True, check=False
            )
        shutil.rmtree(root, ignore_errors=True)
