"""Which server runs: the identity each launcher reads from its system, table by table, and the
restarts a system does by itself (systemd's `Restart=`, the kubelet's container restart)."""

from __future__ import annotations

import os
import signal
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from playbooks.launchers.base import ServerIdentity
from playbooks.launchers.common import rfc3339_epoch
from playbooks.launchers.docker import container_identity
from playbooks.launchers.kube_objects import Obj, Template, pods_identity
from playbooks.launchers.systemd import systemd_timestamp, unit_identity
from tests.playbooks.launchers import fake_systemd
from tests.playbooks.launchers.contract import wait_for
from tests.playbooks.launchers.harness import UNIT, Harness, kubernetes_harness, systemd_harness

T0 = 1715682063.0  # 2024-05-14T10:21:03Z


@pytest.mark.parametrize(
    ("text", "epoch"),
    [
        ("2024-05-14T10:21:03.123456789Z", T0 + 0.123456),  # Docker: Go's RFC3339Nano
        ("2024-05-14T10:21:03.5Z", T0 + 0.5),  # trailing zeros dropped
        ("2024-05-14T10:21:03Z", T0),  # Kubernetes: metav1.Time, seconds
        ("2024-05-14T12:21:03+02:00", T0),
        ("0001-01-01T00:00:00Z", None),  # Go's zero time: never started
        ("", None),
        (None, None),
        ("yesterday", None),
    ],
)
def test_rfc3339_times(text: object, epoch: float | None) -> None:
    assert rfc3339_epoch(text) == (pytest.approx(epoch) if epoch is not None else None)


@pytest.mark.parametrize(
    ("text", "zones", "epoch"),
    [
        ("Tue 2024-05-14 10:21:03 UTC", (), T0),
        ("Tue 2024-05-14 10:21:03 GMT", (), T0),
        ("@1715682063", (), T0),  # --timestamp=unix
        ("Tue 2024-05-14 12:21:03 CEST", ("CET", "CEST"), datetime(2024, 5, 14, 12, 21, 3)),
        ("Tue 2024-05-14 12:21:03 CEST", (), None),  # another host's zone: unknown
        ("", ("UTC",), None),  # never started
        ("n/a", (), None),
        ("Tue 2024-05-14 25:61:03 UTC", (), None),
    ],
)
def test_systemd_timestamps(text: str, zones: tuple[str, ...], epoch: object) -> None:
    want = epoch.timestamp() if isinstance(epoch, datetime) else epoch  # local time
    assert systemd_timestamp(text, zones) == want


RUNNING = {
    "ActiveState": "active",
    "SubState": "running",
    "MainPID": "4242",
    "InvocationID": "0f1e2d3c",
    "ExecMainStartTimestamp": "Tue 2024-05-14 10:21:03 UTC",
    "ExecMainStartTimestampMonotonic": "98765432",
}


@pytest.mark.parametrize(
    ("changes", "same"),
    [
        ({}, True),
        ({"SubState": "reload"}, True),
        ({"InvocationID": "9a8b7c6d"}, False),  # any new start
        ({"ExecMainStartTimestampMonotonic": "99999999"}, False),  # a new main process
    ],
)
def test_a_unit_is_the_same_server_until_systemd_starts_it_again(
    changes: dict[str, str], same: bool
) -> None:
    first = unit_identity(RUNNING, ())
    assert first == ServerIdentity("0f1e2d3c/98765432", T0, "invocation 0f1e2d3c, MainPID 4242")
    assert (unit_identity({**RUNNING, **changes}, ()) == first) is same


@pytest.mark.parametrize(
    "changes",
    [
        {"ActiveState": "activating", "SubState": "auto-restart", "MainPID": "0"},
        {"ActiveState": "failed", "SubState": "failed", "MainPID": "0"},
        {"ActiveState": "inactive", "SubState": "dead", "MainPID": "0"},
        {"MainPID": "0"},
    ],
)
def test_a_unit_without_a_main_process_has_no_identity(changes: dict[str, str]) -> None:
    assert unit_identity({**RUNNING, **changes}, ()) is None


def container(**state: Any) -> dict[str, Any]:
    st = {"Status": "running", "Running": True, "Restarting": False, "Pid": 77}
    st["StartedAt"] = "2024-05-14T10:21:03.123456789Z"
    return {"Id": "ab" * 32, "Name": "/sglang", "State": {**st, **state}}


def test_a_container_is_the_same_server_until_it_starts_again() -> None:
    first = container_identity(container())
    assert first is not None and first.started_at == pytest.approx(T0 + 0.123456)
    assert first.detail == f"container sglang {'ab' * 6}, pid 77"
    assert container_identity(container()) == first
    # its restart policy (or `docker restart`) keeps the Id and renews StartedAt
    assert container_identity(container(StartedAt="2024-05-14T10:25:00.5Z")) != first
    assert container_identity({**container(), "Id": "cd" * 32}) != first
    for down in (
        {"Status": "restarting", "Running": True, "Restarting": True},
        {"Status": "exited", "Running": False, "Pid": 0},
        {"Status": "created", "Running": False, "Pid": 0},
    ):
        assert container_identity(container(**down)) is None, down


TEMPLATE = Template("/spec/template", {}, True, "sglang")
STARTED = "2024-05-14T10:21:03Z"  # metav1.Time: RFC 3339 in seconds


def pod(uid: str, restarts: int = 0, started: str | None = STARTED) -> Obj:
    state = {"running": {"startedAt": started} if started else {}}
    return {
        "metadata": {"name": f"sglang-{uid}", "uid": uid},
        "status": {
            "startTime": "2024-05-14T10:20:00Z",
            "containerStatuses": [{"name": "sglang", "restartCount": restarts, "state": state}],
        },
    }


def waiting(uid: str) -> Obj:
    p = pod(uid, 1)
    p["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
    return p


@pytest.mark.parametrize(
    ("pods", "want", "instance", "started_at"),
    [
        ([pod("u1")], 1, "u1#0", T0),
        ([pod("u1", restarts=1)], 1, "u1#1", T0),  # the kubelet restarted the container
        ([pod("u2"), pod("u1")], 2, "u1#0,u2#0", T0),  # sorted, whatever the list order
        ([pod("u1", started="2024-05-14T10:21:13Z"), pod("u2")], 2, "u1#0,u2#0", T0),
        ([pod("u1", started=None)], 1, "u1#0", T0 - 63),  # no startedAt: the pod's startTime
        ([pod("u1"), waiting("u2")], 2, None, None),  # the server is not whole
        ([pod("u1")], 2, None, None),  # a pod is still to come
        ([waiting("u1")], 1, None, None),
        ([], 1, None, None),
    ],
)
def test_pods_identity(
    pods: list[Obj], want: int, instance: str | None, started_at: float | None
) -> None:
    got = pods_identity([(p, TEMPLATE) for p in pods], want)
    if instance is None:
        assert got is None
    else:
        assert got is not None and (got.instance, got.started_at) == (instance, started_at)


def restarted_by_itself(h: Harness) -> None:
    """SIGKILL the server; the system starts it again by itself, as another server."""
    before = h.launcher().identity()
    pid = h.server_pid()
    assert before is not None and pid is not None
    os.kill(pid, signal.SIGKILL)

    def back() -> bool:
        now = h.launcher().identity()
        return now is not None and now != before

    wait_for("the system to start the server again", back)
    wait_for("the server to be ready", lambda: h.launcher().state().ready)
    assert h.launcher().identity() == h.launcher().identity() != before


def test_systemd_restarting_the_unit_after_a_crash_is_another_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with systemd_harness(tmp_path, monkeypatch) as h:
        dropins = fake_systemd.etc_dir(h.extra["root"]) / f"{UNIT}.d"
        dropins.mkdir(parents=True, exist_ok=True)
        (dropins / "50-restart.conf").write_text("[Service]\nRestartSec=0.2\n")
        for step in (["daemon-reload"], ["restart", UNIT]):
            subprocess.run(["systemctl", *step], check=True)
        wait_for("the unit to be ready", lambda: h.launcher().state().ready)
        restarted_by_itself(h)


def test_the_kubelet_restarting_the_container_is_another_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with kubernetes_harness(tmp_path, monkeypatch, backoff_s=0.2) as h:
        restarted_by_itself(h)
        identity = h.launcher().identity()
        assert identity is not None and identity.instance.endswith("#1"), identity
