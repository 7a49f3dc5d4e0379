"""Four-eyes on the command line, with two real operating-system accounts.

The terminal's identity is the account of the process's uid (never `$USER`), and with
`four_eyes = true` that account may propose a change but not approve it: another account must,
with `kvpilot experiments approve ID` (or an approver in Slack with `/kvpilot approve ID`).
The accounts share the database through a group, as docs/operations.md describes; the
interpreter they run is the system's Python 3.11 with the project's packages on PYTHONPATH
(the virtual environment's own interpreter lives under root's home, out of their reach).
"""

from __future__ import annotations

import grp
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from storage import audit
from storage import experiments as store
from storage import proposals as proposal_store
from storage.db import open_db
from tests.ports import free_port
from tests.twin_process import REPO

SYSTEM_PYTHON = Path("/usr/bin/python3.11")
SITE = REPO / ".venv" / "lib" / "python3.11" / "site-packages"

pytestmark = [
    pytest.mark.serial,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("useradd") is None or not SYSTEM_PYTHON.exists(),
        reason="needs root (to add two accounts with useradd) and Debian's /usr/bin/python3.11",
    ),
]


@dataclass
class Accounts:
    alice: str
    bob: str
    group: str


@pytest.fixture(scope="module")
def accounts() -> Iterator[Accounts]:
    tag = f"{os.getpid() % 100000}"
    acc = Accounts(f"kvpa{tag}", f"kvpb{tag}", f"kvpg{tag}")
    subprocess.run(["groupadd", acc.group], check=True)
    try:
        for name in (acc.alice, acc.bob):
            subprocess.run(
                ["useradd", "-M", "-s", "/usr/sbin/nologin", "-G", acc.group, name], check=True
            )
        yield acc
    finally:
        for name in (acc.alice, acc.bob):
            subprocess.run(["userdel", name], check=False, capture_output=True)
        subprocess.run(["groupdel", acc.group], check=False, capture_output=True)


@dataclass
class Shared:
    root: Path
    config: Path
    port: int
    group: str

    def run(
        self, user: str, *args: str, extra_env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = {
            "PYTHONPATH": f"{REPO}:{SITE}",
            "HOME": str(self.root),
            "MPLCONFIGDIR": str(self.root / "mpl"),
            "PATH": "/usr/bin:/bin",
            **(extra_env or {}),
        }
        return subprocess.run(
            [
                *("runuser", "-u", user, "--", "env", *(f"{k}={v}" for k, v in env.items())),
                *(str(SYSTEM_PYTHON), "-m", "bot.cli", *args, "--config", str(self.config)),
            ],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=300,
        )

    def server_pid(self, user: str) -> int:
        status = self.run(user, "server", "status", "--server", "incident", "--json")
        assert status.returncode == 0, status.stderr
        pid = json.loads(status.stdout)["pid"]
        assert isinstance(pid, int)
        return pid


@pytest.fixture
def shared(accounts: Accounts) -> Iterator[Shared]:
    root = Path(tempfile.mkdtemp(prefix="kvpilot-4eyes-", dir="/tmp"))
    gid = grp.getgrnam(accounts.group).gr_gid
    port = free_port()
    for d in (root, root / "var", root / "var" / "state", root / "mpl"):
        d.mkdir(exist_ok=True)
        os.chown(d, 0, gid)
        d.chmod(0o2770)  # the group shares it; new files take the group
    command = [
        str(SYSTEM_PYTHON), "-m", "sim.launch_server", "--preset", "kimi-k2.5-rtxpro6000-tp8",
        "--port", str(port), "--mem-fraction-static", "0.85", "--enable-metrics",
        "--time-scale", "200", "--workload", "incident", "--concurrency", "150",
    ]  # fmt: skip
    config = root / "kvpilot.toml"
    config.write_text(
        "[kvpilot]\ntime_scale = 200\n\n[gate]\nscrape_s = 10\nbatch_s = 60\n\n"
        '[slack]\napprovers = ["U2"]\nfour_eyes = true\n\n'
        f'[servers.incident]\nurl = "http://127.0.0.1:{port}"\n'
        "gpu_memory_gib = 95.59\nhost_ram_gib = 256\n"
        '[servers.incident.launcher]\nkind = "process"\n'
        f"command = {json.dumps(command)}\n"
        f'env = {{ PYTHONPATH = "{REPO}:{SITE}" }}\n'
    )
    config.chmod(0o644)
    db = root / "var" / "kvpilot.db"
    open_db(db).close()  # created by the administrator, writable by the group
    for f in root.glob("var/kvpilot.db*"):
        os.chown(f, 0, gid)
        f.chmod(0o660)
    s = Shared(root, config, port, accounts.group)
    try:
        yield s
    finally:
        s.run(accounts.bob, "server", "stop", "--server", "incident")
        shutil.rmtree(root, ignore_errors=True)


def test_a_proposer_cannot_approve_their_own_change_from_the_terminal(
    accounts: Accounts, shared: Shared
) -> None:
    started = shared.run(accounts.bob, "server", "start", "--server", "incident")
    assert started.returncode == 0, started.stderr
    before = shared.server_pid(accounts.bob)
    db = open_db(shared.root / "var" / "kvpilot.db")

    # alice proposes, pretending to be bob through the environment: she stays alice
    proposed = shared.run(
        accounts.alice,
        *("experiment", "--server", "incident", "--set", "mem_fraction_static=0.88", "--yes"),
        extra_env={"USER": accounts.bob, "LOGNAME": accounts.bob},
    )
    assert proposed.returncode == 7, proposed.stderr  # waiting for another person
    assert "four-eyes is on" in proposed.stderr
    assert "kvpilot experiments approve 1" in proposed.stderr, proposed.stderr
    assert "/kvpilot approve 1" in proposed.stderr
    proposal = proposal_store.get_proposal(db, 1)
    assert proposal.created_by == f"cli:{accounts.alice}"
    assert store.list_experiments(db) == []
    denied = audit.events(db, name="access_denied")
    assert [(e["actor"], e["properties"]["action"]) for e in denied] == [
        (f"cli:{accounts.alice}", "approve")
    ]

    # alice's own approval is refused and audited; nothing runs
    own = shared.run(accounts.alice, "experiments", "approve", "1", "--yes")
    assert own.returncode == 2, own.stderr
    assert "four-eyes" in own.stderr
    assert len(audit.events(db, name="access_denied")) == 2
    assert store.list_experiments(db) == [] and proposal_store.approvals(db, 1) == []
    assert shared.server_pid(accounts.bob) == before  # not restarted

    # bob approves: the experiment runs in his terminal and ends with a verdict
    approved = shared.run(accounts.bob, "experiments", "approve", "1", "--yes", "--json")
    result = json.loads(approved.stdout)
    assert approved.returncode == result["exit_code"], approved.stderr
    assert result["state"] in ("kept", "reverted"), result
    (decision,) = proposal_store.approvals(db, 1)
    assert (decision.decision, decision.actor) == ("approved", f"cli:{accounts.bob}")
    (row,) = store.list_experiments(db)
    moves = store.transitions(db, row.id)
    assert [(m.to_state, m.actor) for m in moves[:2]] == [
        ("proposed", f"cli:{accounts.alice}"),
        ("approved", f"cli:{accounts.bob}"),
    ]
    assert row.proposal_id == 1
    restarts = audit.events(db, experiment_id=row.id, name="restart_started")
    assert len(restarts) == 1
    # a second approval of the same proposal starts nothing
    again = shared.run(accounts.bob, "experiments", "approve", "1", "--yes")
    assert again.returncode == 2 and "already approved" in again.stderr, again.stderr
