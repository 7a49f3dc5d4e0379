"""The fake systemd (tests/playbooks/launchers/fake_systemd.py) and a real one (systemd 252 in a
container, over SSH) answer the same `systemctl` and `journalctl` calls the same way, in each
state the launcher reads: not installed, running, failed by its exit status, killed, waiting to
restart, unable to execute, stopped. The assertions are what the real one was seen to do; the
fake runs them in the fast tier, the real one in `make test-daemons`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.playbooks.launchers import fake_systemd

PROPS = (
    "LoadState,ActiveState,SubState,Result,MainPID,ExecMainCode,ExecMainStatus,NRestarts,"
    "InvocationID,ExecMainStartTimestamp"
)
UNITS = {
    "run.service": "/bin/sh -c 'echo hello; exec sleep 600'",
    "exit.service": "/bin/sh -c 'echo bye; exit 3'",
    "again.service": "/bin/sh -c 'echo again; exit 3'\nRestart=on-failure\nRestartSec=600",
    "noexec.service": "/nonexistent/binary --x",
}


@dataclass
class Manager:
    units: Path  # where unit files go, on this host
    call: Callable[[list[str]], subprocess.CompletedProcess[str]]
    host_pid: Callable[[int], int | None]
    prefix: str  # the units' names, unique to the test

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return self.call(list(argv))

    def name(self, unit: str) -> str:
        return self.prefix + unit

    def show(self, unit: str) -> dict[str, str]:
        done = self.run("systemctl", "show", "-p", PROPS, "--", self.name(unit))
        assert done.returncode == 0, done.stderr
        return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)

    def journal(self, unit: str) -> list[dict[str, Any]]:
        """The unit's lines by its fields, not `-u`: a line from the unit's forked child that
        exits at once (an executable that cannot run) carries `UNIT=`, but journald may not
        read the child's cgroup in time to add `_SYSTEMD_UNIT`, and `-u` takes `UNIT=` only
        from PID 1; a busy CI machine lost the line that way."""
        name = self.name(unit)
        done = self.run(
            "journalctl", "--no-pager", "-o", "json", f"_SYSTEMD_UNIT={name}", "+", f"UNIT={name}"
        )
        return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]

    def journal_until(
        self, unit: str, done: Callable[[list[dict[str, Any]]], bool]
    ) -> list[dict[str, Any]]:
        """The unit's journal once `done` holds for it, or as it is after 10 s: journald stores a
        line a moment after the unit's state has changed, which on a busy machine is after the
        test looks."""
        deadline = time.monotonic() + 10
        while not done(entries := self.journal(unit)) and time.monotonic() < deadline:
            time.sleep(0.1)
        return entries

    def settle(self, unit: str, check: Callable[[dict[str, str]], bool]) -> dict[str, str]:
        deadline = time.monotonic() + 30
        while not check(props := self.show(unit)):
            assert time.monotonic() < deadline, props
            time.sleep(0.1)
        return props


def fake_manager(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Manager]:
    root, bin_dir = tmp / "host", tmp / "bin"
    fake_systemd.unit_dir(root).mkdir(parents=True)
    fake_systemd.install_tools(root, bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def call(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)

    try:
        yield Manager(fake_systemd.unit_dir(root), call, lambda pid: pid, "")
    finally:
        fake_systemd.stop_all(root)


def real_manager(request: pytest.FixtureRequest) -> Iterator[Manager]:
    box = request.getfixturevalue("systemd_box")
    prefix = f"conf{os.getpid()}-"

    def call(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return box.ssh(*argv)  # type: ignore[no-any-return]

    manager = Manager(box.units, call, box.host_pid, prefix)
    try:
        yield manager
    finally:
        names = [manager.name(u) for u in UNITS]
        box.ssh("systemctl", "stop", *names)
        box.ssh("rm", "-f", *(f"/etc/systemd/system/{n}" for n in names))
        box.ssh("systemctl", "daemon-reload")
        box.ssh("systemctl", "reset-failed", *names)


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.real_daemons)])
def manager(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Manager]:
    if request.param == "fake":
        yield from fake_manager(tmp_path, monkeypatch)
    else:
        yield from real_manager(request)


def install(m: Manager) -> None:
    for unit, command in UNITS.items():
        (m.units / m.name(unit)).write_text(
            f"[Unit]\nDescription=probe {unit}\n\n[Service]\nType=simple\nExecStart={command}\n"
        )
    assert m.run("systemctl", "daemon-reload").returncode == 0


def messages_of(entries: list[dict[str, Any]]) -> list[tuple[str | None, str]]:
    return [(e.get("MESSAGE_ID"), e["MESSAGE"]) for e in entries]


def assert_said(m: Manager, unit: str, *wanted: tuple[str | None, str]) -> None:
    """Each of `wanted` is in the unit's journal, given journald a moment to store it."""
    said = messages_of(m.journal_until(unit, lambda es: set(wanted) <= set(messages_of(es))))
    assert set(wanted) <= set(said), said


def test_a_unit_that_is_not_installed(manager: Manager) -> None:
    props = manager.show("nope.service")
    assert (props["LoadState"], props["ActiveState"], props["InvocationID"]) == (
        "not-found", "inactive", "",
    )  # fmt: skip
    cat = manager.run("systemctl", "cat", "--", manager.name("nope.service"))
    assert (cat.returncode, cat.stderr) == (
        1,
        f"No files found for {manager.name('nope')}.service.\n",
    )
    start = manager.run("systemctl", "start", manager.name("nope.service"))
    name = manager.name("nope.service")
    assert (start.returncode, start.stderr) == (
        5, f"Failed to start {name}: Unit {name} not found.\n",
    )  # fmt: skip
    verb = manager.run("systemctl", "bogus", name)
    assert (verb.returncode, verb.stderr) == (1, "Unknown command verb bogus.\n")


def test_running_killed_and_stopped(manager: Manager) -> None:
    install(manager)
    unit = manager.name("run.service")
    assert manager.run("systemctl", "start", unit).returncode == 0
    props = manager.settle("run.service", lambda p: p["SubState"] == "running")
    assert (props["ActiveState"], props["Result"], props["ExecMainCode"], props["NRestarts"]) == (
        "active", "success", "0", "0",
    )  # fmt: skip
    assert int(props["MainPID"]) > 0 and props["InvocationID"] and props["ExecMainStartTimestamp"]
    invocation = props["InvocationID"]
    entries = manager.journal_until(
        "run.service", lambda es: any(e.get("MESSAGE") == "hello" for e in es)
    )
    started = [e for e in entries if e.get("MESSAGE") == "hello"]
    assert [e["_SYSTEMD_INVOCATION_ID"] for e in started] == [invocation]
    assert_said(
        manager,
        "run.service",
        (fake_systemd.MESSAGE_IDS["started"], f"Started {unit} - probe run.service."),
    )

    pid = manager.host_pid(int(props["MainPID"]))
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    props = manager.settle("run.service", lambda p: p["ActiveState"] == "failed")
    assert (props["SubState"], props["Result"], props["ExecMainCode"], props["ExecMainStatus"]) == (
        "failed", "signal", "2", "9",
    )  # fmt: skip
    assert props["InvocationID"] == invocation and props["MainPID"] == "0"
    assert_said(
        manager,
        "run.service",
        (
            fake_systemd.MESSAGE_IDS["exited"],
            f"{unit}: Main process exited, code=killed, status=9/KILL",
        ),
    )
    active = manager.run("systemctl", "is-active", unit)
    assert (active.returncode, active.stdout) == (3, "failed\n")

    assert manager.run("systemctl", "start", unit).returncode == 0
    again = manager.settle("run.service", lambda p: p["SubState"] == "running")
    assert again["InvocationID"] != invocation
    assert manager.run("systemctl", "stop", unit).returncode == 0
    # stopped cleanly, the unit is unloaded: nothing of its last run is left to `show`
    props = manager.show("run.service")
    assert {k: props[k] for k in ("ActiveState", "SubState", "Result", "InvocationID")} == {
        "ActiveState": "inactive", "SubState": "dead", "Result": "success", "InvocationID": "",
    }  # fmt: skip
    assert (props["ExecMainCode"], props["ExecMainStatus"], props["MainPID"]) == ("0", "0", "0")


def test_exits_restarts_and_commands_that_cannot_run(manager: Manager) -> None:
    install(manager)
    for unit in ("exit.service", "again.service", "noexec.service"):
        # Type=simple: the start job is done once forked, whatever the command does next
        assert manager.run("systemctl", "start", manager.name(unit)).returncode == 0

    failed = manager.settle("exit.service", lambda p: p["ActiveState"] == "failed")
    assert (failed["Result"], failed["ExecMainCode"], failed["ExecMainStatus"]) == (
        "exit-code", "1", "3",
    )  # fmt: skip
    unit = manager.name("exit.service")
    assert_said(
        manager,
        "exit.service",
        (
            fake_systemd.MESSAGE_IDS["exited"],
            f"{unit}: Main process exited, code=exited, status=3/NOTIMPLEMENTED",
        ),
        (fake_systemd.MESSAGE_IDS["failed"], f"{unit}: Failed with result 'exit-code'."),
    )

    waiting = manager.settle("again.service", lambda p: p["SubState"] == "auto-restart")
    assert (waiting["ActiveState"], waiting["Result"], waiting["NRestarts"]) == (
        "activating", "exit-code", "0",
    )  # fmt: skip

    noexec = manager.settle("noexec.service", lambda p: p["ActiveState"] == "failed")
    assert (noexec["Result"], noexec["ExecMainCode"], noexec["ExecMainStatus"]) == (
        "exit-code", "1", "203",
    )  # fmt: skip
    unit = manager.name("noexec.service")
    wanted = f"{unit}: Failed to locate executable /nonexistent/binary: No such file or directory"
    entries = manager.journal_until(
        "noexec.service", lambda es: any(e["MESSAGE"] == wanted for e in es)
    )
    located = [e for e in entries if e["MESSAGE"] == wanted]
    assert [e["INVOCATION_ID"] for e in located] == [noexec["InvocationID"]], entries
    assert_said(
        manager,
        "noexec.service",
        (
            fake_systemd.MESSAGE_IDS["exited"],
            f"{unit}: Main process exited, code=exited, status=203/EXEC",
        ),
    )
