"""The test port allocator: no two claimants share a port, a busy port is skipped."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import ports


@pytest.fixture
def claims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(ports, "CLAIMS", tmp_path)
    return tmp_path


def test_ports_are_below_the_ephemeral_range_and_never_handed_out_twice(claims: Path) -> None:
    got = [ports.free_port() for _ in range(200)]
    assert len(set(got)) == 200
    assert all(ports.LOW <= p < ports.HIGH for p in got)


def test_processes_starting_at_the_same_port_never_share_one(claims: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from tests import ports;"
        f"ports.CLAIMS = Path({str(claims)!r}); ports._next = ports.LOW;"
        "print(*[ports.free_port() for _ in range(100)])"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    got = [int(p) for proc in procs for p in proc.communicate(timeout=60)[0].split()]
    assert len(got) == 400 and len(set(got)) == 400


def test_a_port_something_listens_on_is_skipped(claims: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", ports.LOW + 7))
        held.listen()
        ports._next = ports.LOW + 7
        assert ports.free_port() == ports.LOW + 8


def test_a_stale_claim_is_taken_again_and_a_fresh_one_is_not(claims: Path) -> None:
    fresh, stale = claims / str(ports.LOW + 20), claims / str(ports.LOW + 21)
    fresh.touch()
    stale.touch()
    old = time.time() - ports.STALE_S - 60
    os.utime(stale, (old, old))
    ports._next = ports.LOW + 20
    assert ports.free_port() == ports.LOW + 21
