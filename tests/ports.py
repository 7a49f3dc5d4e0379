"""Loopback ports for servers the tests start, claimed so that no two tests share one.

Binding port 0 and closing the socket hands back a port from the kernel's ephemeral range
(32768-60999 here), which any outgoing connection on the machine may take before the server
binds it, and which another test process, knowing nothing of the first, may pick too. Under
the parallel tier that happened: a twin exited "the port is already in use". So ports come
from below the ephemeral range, and each is claimed with a file created exclusively in one
folder shared by every test process of this user; a claim older than `STALE_S` is a
finished test's and may be taken again.
"""

from __future__ import annotations

import os
import random
import socket
import tempfile
import time
from pathlib import Path

LOW, HIGH = 20000, 32000  # below Linux's default ip_local_port_range (32768-60999)
STALE_S = 1800.0  # longer than any test holds a port
CLAIMS = Path(tempfile.gettempdir()) / f"kvpilot-test-ports-{os.getuid()}"

_next = random.randrange(LOW, HIGH)


def _claim(port: int) -> bool:
    path = CLAIMS / str(port)
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        return True
    except FileExistsError:
        try:
            if time.time() - path.stat().st_mtime < STALE_S:
                return False
            path.unlink()
        except FileNotFoundError:
            pass
        return _claim_fresh(path)


def _claim_fresh(path: Path) -> bool:
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        return True
    except FileExistsError:  # another process reclaimed it first
        return False


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port no other test holds and nothing listens on (or lingers on) right now."""
    global _next
    CLAIMS.mkdir(mode=0o700, exist_ok=True)
    for _ in range(HIGH - LOW):
        port, _next = _next, LOW + (_next + 1 - LOW) % (HIGH - LOW)
        if _claim(port) and _bindable(host, port):
            return port
    raise RuntimeError(f"no free port in {LOW}-{HIGH}: clear {CLAIMS} if its claims are stale")
