"""The twin as a service unit of a real systemd (tests/real_daemons/systemd_box.py), reached
over SSH with argument lists as production reaches a GPU host, for the launcher contract.

The unit is what an operator installs (tests/playbooks/launchers/harness.py, `unit_text`), in
the box's /etc/systemd/system; kvpilot's drop-in goes beside it, in the default place. Each test
has a unit of its own (its name carries the twin's port), removed after it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.playbooks.launchers.harness import Harness, twin_args, unit_text, write_config
from tests.ports import free_port
from tests.real_daemons.systemd_box import SystemdBox

# systemd's SD_MESSAGE_UNIT_STARTED (src/systemd/sd-messages.h): "Started UNIT." once a start
# job of a unit has completed, one per start, whoever asked for it.
UNIT_STARTED = "39f53479d3a045ac8e11786248231fbf"
DROPIN = "90-kvpilot.conf"


@contextmanager
def real_systemd_harness(
    tmp: Path, monkeypatch: pytest.MonkeyPatch, box: SystemdBox, engine: str = "sglang"
) -> Iterator[Harness]:
    port = free_port()
    args = twin_args(port, engine=engine)
    unit = f"sglang-twin-{port}.service"
    (box.units / unit).write_text(unit_text(args, engine))
    options = ", ".join(json.dumps(o) for o in box.ssh_options)
    config = write_config(
        tmp / "kvpilot.toml",
        port,
        f'kind = "systemd"\nunit = "{unit}"\nssh_host = "{box.ssh_host}"\n'
        f"ssh_options = [{options}]\n",
        engine,
    )

    def leftovers() -> list[str]:
        dropins = sorted(p.name for p in (box.units / f"{unit}.d").glob("*"))
        return [f"drop-in {d}" for d in dropins if d != DROPIN]

    def starts() -> int:
        done = box.ssh(
            "journalctl", "--no-pager", "-o", "json", f"MESSAGE_ID={UNIT_STARTED}", f"UNIT={unit}"
        )
        assert done.returncode in (0, 1), done.stderr  # 1: no entries yet
        return sum(1 for line in done.stdout.splitlines() if line.strip())

    def server_pid() -> int | None:
        pid = h.launcher().state().pid
        return None if pid is None else box.host_pid(pid)

    for step in (["daemon-reload"], ["start", unit]):
        done = box.ssh("systemctl", *step)
        assert done.returncode == 0, done.stderr
    h = Harness("systemd-real", config, port, args, server_pid, leftovers, starts)
    h.extra.update(box=box, unit=unit)
    try:
        h.launcher().wait_ready()
        yield h
    finally:
        box.ssh("systemctl", "stop", unit)
        box.ssh("rm", "-rf", f"/etc/systemd/system/{unit}", f"/etc/systemd/system/{unit}.d")
        box.ssh("systemctl", "daemon-reload")
        box.ssh("systemctl", "reset-failed", unit)
