"""Who carries an experiment: process identities, leases, takeover and loss (one process)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from playbooks.experiments.ownership import Lease, Owner, OwnershipLost, this_process
from storage import acquire_lease, create_experiment, get_experiment, open_db


def experiment(path: Path) -> int:
    db = open_db(path)
    try:
        return create_experiment(
            db, server="gpu-1", change={}, baseline_config={}, trial_config={}, settings={},
            actor="U1", now=datetime.now(UTC),
        )  # fmt: skip
    finally:
        db.close()


def test_this_process_is_alive_and_a_finished_one_is_gone() -> None:
    me = this_process()
    assert Owner.parse(str(me)) == me and not me.gone()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    dead = Owner(socket.gethostname(), child.pid, me.started, "x")
    assert dead.gone()
    # the same pid with another start time is another (reused) process: the old one is gone
    assert Owner(me.host, me.pid, me.started - 1000, "x").gone()
    # a holder on another host is never presumed dead: its lease has to expire
    assert not Owner("another-host", child.pid, me.started, "x").gone()
    assert Owner.parse("U123") is None


def test_a_step_of_the_wall_clock_does_not_make_a_living_owner_dead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NTP or an operator steps the clock: the kernel moves the boot time it reports, so a start
    time in wall-clock terms moves with it. A live holder must not then look dead (a takeover
    of a running experiment would give it two owners)."""
    import psutil  # noqa: PLC0415
    import psutil._pslinux as linux  # noqa: PLC0415

    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        owner = Owner(socket.gethostname(), holder.pid, _start_ms(holder.pid), "other")
        assert not owner.gone()
        booted = linux.boot_time()
        monkeypatch.setattr(linux, "boot_time", lambda: booted + 13.0)  # the clock stepped 13 s
        assert not owner.gone()
        assert not this_process().gone()
        monkeypatch.undo()
        # an owner named by an older kvpilot (epoch milliseconds) is still judged as it was
        legacy_ms = int(psutil.Process(holder.pid).create_time() * 1000)
        assert not Owner(owner.host, holder.pid, legacy_ms, "old").gone()
        assert Owner(owner.host, holder.pid, legacy_ms - 5000, "old").gone()
    finally:
        holder.kill()
        holder.wait()


def test_a_lease_held_by_a_living_process_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "kvpilot.db"
    exp = experiment(path)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        other = Owner(socket.gethostname(), holder.pid, _start_ms(holder.pid), "other")
        db = open_db(path)
        assert acquire_lease(db, exp, str(other), datetime.now(UTC), ttl_s=30)
        mine = Lease(lambda: open_db(path), exp)
        assert not mine.acquire()
        assert mine.holder()[0] == str(other)
        holder.kill()
        holder.wait()
        assert mine.acquire()  # the holder is gone: taken over at once
        assert get_experiment(db, exp).lease_owner == mine.owner
    finally:
        holder.kill()
        holder.wait()


def _start_ms(pid: int) -> int:
    from playbooks.experiments.ownership import start_mark  # noqa: PLC0415

    return start_mark(pid)


def test_renewal_keeps_the_lease_and_a_takeover_is_noticed(tmp_path: Path) -> None:
    path = tmp_path / "kvpilot.db"
    exp = experiment(path)
    lease = Lease(lambda: open_db(path), exp, ttl_s=0.6, renew_every_s=0.05)
    assert lease.acquire()
    lease.start()
    try:
        time.sleep(1.0)  # longer than the lease: renewal keeps it
        lease.check(sync=True)
        db = open_db(path)
        # another host's process steals it (as if our renewals had stalled past the expiry)
        db.execute(
            "UPDATE experiments SET lease_owner = ?, lease_expires_at = ? WHERE id = ?",
            ["elsewhere/1/1/x", (datetime.now(UTC) + timedelta(hours=1)).isoformat(), exp],
        )
        deadline = time.monotonic() + 5
        while True:
            try:
                lease.check()
            except OwnershipLost as exc:
                assert "took the experiment over" in str(exc)
                break
            assert time.monotonic() < deadline, "the loss was never noticed"
            time.sleep(0.02)
    finally:
        lease.release()
    assert get_experiment(db, exp).lease_owner == "elsewhere/1/1/x"  # release left it alone


def test_a_synchronous_check_notices_a_takeover_before_any_renewal(tmp_path: Path) -> None:
    path = tmp_path / "kvpilot.db"
    exp = experiment(path)
    lease = Lease(lambda: open_db(path), exp)
    assert lease.acquire()
    open_db(path).execute(
        "UPDATE experiments SET lease_owner = 'elsewhere/1/1/x' WHERE id = ?", [exp]
    )
    lease.check()  # nothing seen yet without asking the database
    with pytest.raises(OwnershipLost, match="held by elsewhere"):
        lease.check(sync=True)


def test_stopping_makes_every_check_fail(tmp_path: Path) -> None:
    path = tmp_path / "kvpilot.db"
    stopping = threading.Event()
    lease = Lease(lambda: open_db(path), experiment(path), stopping=stopping)
    assert lease.acquire()
    stopping.set()
    with pytest.raises(OwnershipLost, match="stopping"):
        lease.check()
    lease.release()
    assert get_experiment(open_db(path), lease.experiment_id).lease_owner is None
    assert os.getpid() == this_process().pid
