"""`permissions()`: what each launcher will need to restart its server, looked at without
changing anything. All well on every harness; each thing missing named with its fix."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import httpx
import pytest

from bot.app.config import load
from bot.app.wiring import launcher as build_launcher
from playbooks.clock import WallClock
from playbooks.launchers.base import Finding
from playbooks.launchers.systemd import authority
from tests.playbooks.launchers.harness import (
    UNIT,
    Harness,
    docker_harness,
    kubernetes_harness,
    systemd_harness,
)


def problems(findings: list[Finding]) -> list[str]:
    return [f"{f.detail} | {f.fix}" for f in findings if not f.ok]


def findings_of(config: Path) -> list[Finding]:
    cfg = load(str(config))
    return build_launcher(cfg, cfg.server("twin"), WallClock()).permissions()


def test_all_well_on_every_launcher(system: Harness) -> None:
    before = system.starts()
    found = system.launcher().permissions()
    assert found and problems(found) == []
    assert system.starts() == before and system.leftovers() == []  # nothing was changed


def test_process_command_not_found(tmp_path: Path) -> None:
    config = tmp_path / "kvpilot.toml"
    (tmp_path / "file").write_text("x")
    config.write_text(
        f'[kvpilot]\nstate_dir = "{tmp_path}/file/state"\n\n'
        '[servers.twin]\nurl = "http://127.0.0.1:9"\n\n'
        '[servers.twin.launcher]\nkind = "process"\ncommand = ["no-such-sglang", "--port", "9"]\n'
    )
    found = problems(findings_of(config))
    assert any(
        "'no-such-sglang' is not an executable on PATH | give the full path" in p for p in found
    ), found
    assert any("log cannot be written" in p and "state_dir" in p for p in found), found
    assert not (tmp_path / "state").exists()


def test_systemd_unit_missing_and_dropin_unwritable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with systemd_harness(tmp_path, monkeypatch) as system:
        unit_missing_and_dropin_unwritable(system)


def unit_missing_and_dropin_unwritable(system: Harness) -> None:
    text = system.config.read_text()
    system.config.write_text(text.replace(f'unit = "{UNIT}"', 'unit = "other.service"'))
    found = problems(system.launcher().permissions())
    assert any("unit other.service is not-found | install the unit" in p for p in found), found
    (system.config.parent / "blocker").write_text("a file, not a directory")
    system.config.write_text(
        text.replace(
            f'dropin_dir = "{system.extra["root"]}/etc/systemd/system"',
            f'dropin_dir = "{system.config.parent}/blocker/sub"',
        )
    )
    found = problems(system.launcher().permissions())
    assert any("drop-in" in p and "cannot be written" in p for p in found), found


@pytest.mark.parametrize(
    ("scope", "uid", "manage", "reload", "ok", "says"),
    [
        ("user", 1000, 127, 127, True, "user unit"),
        ("system", 0, 127, 127, True, "root"),
        ("system", 999, 0, 0, True, "polkit allows"),
        ("system", 999, 127, 127, False, "polkit is not installed"),
        ("system", 999, 1, 0, False, "manage-units refused"),
        ("system", 999, 0, 2, False, "reload-daemon asks for a password"),
        ("system", -1, 4, 4, False, "manage-units failed (4), reload-daemon failed (4)"),
    ],
)
def test_who_may_restart_a_unit(
    scope: str, uid: int, manage: int, reload: int, ok: bool, says: str
) -> None:
    found = authority(scope, uid, manage, reload)
    assert found.ok is ok and says in found.detail
    assert ok or "50-kvpilot.rules" in found.fix


def test_docker_socket_and_container(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with docker_harness(tmp_path, monkeypatch) as h:
        socket = h.config.read_text().split('socket = "')[1].split('"')[0]
        transport = httpx.HTTPTransport(uds=socket)
        with httpx.Client(transport=transport, base_url="http://docker/v1.41") as docker:
            assert docker.post("/containers/sglang/rename?name=other").status_code == 204
            found = problems(h.launcher().permissions())
            assert any(
                "no container named 'sglang'" in p and "docker run --name sglang" in p
                for p in found
            ), found
            assert docker.post("/containers/other/rename?name=sglang").status_code == 204
    found = problems(findings_of(h.config))  # the Engine is gone with its socket
    assert any("cannot reach the Docker Engine" in p and "docker group" in p for p in found)


def test_kubernetes_access_review_names_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with kubernetes_harness(tmp_path, monkeypatch) as h:
        cluster = h.extra["cluster"]
        seen = len(cluster.accesses)
        cluster.rules = [r for r in cluster.rules if r["resources"] != ["pods/log"]]
        found = problems(h.launcher().permissions())
        assert found == [
            "Kubernetes does not allow kvpilot to get pods/log in namespace sglang | apply "
            "deploy/kubernetes/rbac.yaml (its Role and RoleBinding) in this namespace, for the "
            "account kvpilot uses"
        ]
        # the review asked; only the read of the workload was a request of its own
        assert [a.verb for a in cluster.accesses[seen:]] == ["get"]


def test_no_write_on_a_process_launcher(tmp_path: Path) -> None:
    state = tmp_path / "state"
    config = tmp_path / "kvpilot.toml"
    exe = shutil.which("python3")
    assert exe is not None and os.access(exe, os.X_OK)
    config.write_text(
        f'[kvpilot]\nstate_dir = "{state}"\n\n[servers.twin]\nurl = "http://127.0.0.1:9"\n\n'
        f'[servers.twin.launcher]\nkind = "process"\ncommand = ["{exe}", "--port", "9"]\n'
    )
    assert problems(findings_of(config)) == []
    assert not state.exists()
