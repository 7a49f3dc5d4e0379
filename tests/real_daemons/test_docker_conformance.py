"""The fake Docker Engine (tests/playbooks/launchers/fake_docker.py) and the real one (Debian's
dockerd 20.10) answer the Engine API calls the docker launcher makes the same way: inspect,
create (and a name taken), start and stop (and doing either twice), logs with their stream
framing, a container killed or exiting by itself, rename, remove. The assertions are what the
real Engine was seen to do; the fake runs them in the fast tier, the real one in
`make test-daemons`.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import struct
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.playbooks.launchers.fake_docker import FakeDockerEngine, Image
from tests.playbooks.launchers.serving import serving
from tests.real_daemons.docker_harness import mounts
from tests.real_daemons.dockerd import BASE_IMAGE

FAKE_IMAGE = Image("kvpilot/conformance:1", "sha256:" + "c0" * 32, env=["PATH=/usr/bin:/bin"])
NEVER = "0001-01-01T00:00:00Z"


@dataclass
class Engine:
    client: httpx.Client
    body: Callable[[list[str]], dict[str, Any]]  # a create body running this command

    def inspect(self, name: str) -> dict[str, Any]:
        found = self.client.get(f"/containers/{name}/json")
        assert found.status_code == 200, found.text
        answer: dict[str, Any] = found.json()
        return answer

    def settle(self, name: str, check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        deadline = time.monotonic() + 30
        while not check(state := dict(self.inspect(name)["State"])):
            assert time.monotonic() < deadline, state
            time.sleep(0.05)
        return state


def fake_engine() -> Iterator[Engine]:
    short = tempfile.mkdtemp(prefix="kvc-")  # a socket path holds 107 bytes
    daemon = FakeDockerEngine([FAKE_IMAGE])
    try:
        with serving(daemon.app(), uds=f"{short}/docker.sock"):
            transport = httpx.HTTPTransport(uds=f"{short}/docker.sock")
            with httpx.Client(
                transport=transport, base_url="http://docker/v1.41", timeout=60
            ) as client:
                yield Engine(client, lambda cmd: {"Image": FAKE_IMAGE.ref, "Cmd": cmd})
    finally:
        daemon.shutdown()
        shutil.rmtree(short, ignore_errors=True)


def real_engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    daemon = request.getfixturevalue("dockerd")
    host = {"Binds": mounts(), "NetworkMode": "host"}
    with daemon.client() as client:
        yield Engine(client, lambda cmd: {"Image": BASE_IMAGE, "Cmd": cmd, "HostConfig": host})


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.real_daemons)])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    made = fake_engine() if request.param == "fake" else real_engine(request)
    names: list[str] = []
    request.node.names = names
    for e in made:
        try:
            yield e
        finally:
            for name in names:
                e.client.delete(f"/containers/{name}", params={"force": "true"})


def name_for(request: pytest.FixtureRequest, what: str) -> str:
    name = f"kvpilot-conf-{what}-{secrets.token_hex(3)}"
    request.node.names.append(name)
    return name


def frames(data: bytes) -> list[tuple[int, bytes]]:
    """The Engine's multiplexed stream: an 8-byte header (stream, 0, 0, 0, big-endian size)."""
    out, i = [], 0
    while i < len(data):
        stream, size = struct.unpack(">BxxxL", data[i : i + 8])
        out.append((stream, data[i + 8 : i + 8 + size]))
        i += 8 + size
    return out


def test_missing_containers_and_taken_names(engine: Engine, request: pytest.FixtureRequest) -> None:
    missing = engine.client.get("/containers/kvpilot-conf-nope/json")
    assert (missing.status_code, missing.json()) == (
        404, {"message": "No such container: kvpilot-conf-nope"},
    )  # fmt: skip
    gone = engine.client.delete("/containers/kvpilot-conf-nope", params={"force": "true"})
    assert (gone.status_code, gone.json()["message"]) == (
        404, "No such container: kvpilot-conf-nope",
    )  # fmt: skip

    name = name_for(request, "taken")
    body = engine.body(["/bin/sh", "-c", "exec sleep 600"])
    created = engine.client.post("/containers/create", params={"name": name}, json=body)
    assert created.status_code == 201 and set(created.json()) == {"Id", "Warnings"}, created.text
    ident = created.json()["Id"]
    again = engine.client.post("/containers/create", params={"name": name}, json=body)
    assert (again.status_code, again.json()["message"]) == (
        409,
        f'Conflict. The container name "/{name}" is already in use by container "{ident}". '
        "You have to remove (or rename) that container to be able to reuse that name.",
    )
    state = engine.inspect(name)["State"]
    assert {k: state[k] for k in ("Status", "Running", "Pid", "ExitCode", "StartedAt")} == {
        "Status": "created", "Running": False, "Pid": 0, "ExitCode": 0, "StartedAt": NEVER,
    }  # fmt: skip

    other = name_for(request, "other")
    engine.client.post("/containers/create", params={"name": other}, json=body)
    clash = engine.client.post(f"/containers/{other}/rename", params={"name": name})
    assert clash.status_code == 409, clash.text
    assert clash.json()["message"].startswith(
        f'Error when allocating new name: Conflict. The container name "/{name}" is already in use'
    ), clash.text


def test_start_logs_kill_stop_and_remove(engine: Engine, request: pytest.FixtureRequest) -> None:
    name = name_for(request, "life")
    body = engine.body(["/bin/sh", "-c", "echo out; echo err >&2; exec sleep 600"])
    assert engine.client.post("/containers/create", params={"name": name}, json=body).is_success
    assert engine.client.post(f"/containers/{name}/start").status_code == 204
    assert engine.client.post(f"/containers/{name}/start").status_code == 304
    state = engine.settle(name, lambda s: bool(s["Running"]))
    assert state["Status"] == "running" and state["Pid"] > 0 and state["StartedAt"] != NEVER
    running = engine.client.delete(f"/containers/{name}")
    assert running.status_code == 409, running.text
    assert running.json()["message"].startswith("You cannot remove a running container"), running

    deadline = time.monotonic() + 10
    while (
        len(
            frames(
                engine.client.get(
                    f"/containers/{name}/logs", params={"stdout": "1", "stderr": "1"}
                ).content
            )
        )
        < 2
    ):
        assert time.monotonic() < deadline
        time.sleep(0.05)  # fmt: skip
    logs = engine.client.get(f"/containers/{name}/logs", params={"stdout": "1", "stderr": "1"})
    assert sorted(frames(logs.content)) == [(1, b"out\n"), (2, b"err\n")], logs.content

    os.kill(int(state["Pid"]), signal.SIGKILL)
    state = engine.settle(name, lambda s: not s["Running"])
    assert {k: state[k] for k in ("Status", "ExitCode", "OOMKilled", "Restarting")} == {
        "Status": "exited", "ExitCode": 137, "OOMKilled": False, "Restarting": False,
    }  # fmt: skip
    assert state["FinishedAt"] != NEVER
    assert engine.client.post(f"/containers/{name}/stop").status_code == 304

    assert engine.client.post(f"/containers/{name}/start").status_code == 204
    engine.settle(name, lambda s: bool(s["Running"]))
    stopped = engine.client.post(f"/containers/{name}/stop", params={"t": "1"})
    assert stopped.status_code == 204
    state = engine.inspect(name)["State"]
    # `sleep` is PID 1 of the container and has no SIGTERM handler: the kernel drops the
    # signal, and the Engine's SIGKILL after `t` seconds ends it
    assert (state["Status"], state["ExitCode"]) == ("exited", 137)
    assert engine.client.delete(f"/containers/{name}").status_code == 204

    handled = name_for(request, "term")
    trap = "trap 'exit 143' TERM; sleep 600 & wait"
    body = engine.body(["/bin/sh", "-c", trap])
    assert engine.client.post("/containers/create", params={"name": handled}, json=body).is_success
    assert engine.client.post(f"/containers/{handled}/start").status_code == 204
    engine.settle(handled, lambda s: bool(s["Running"]))
    time.sleep(0.2)  # the shell has set its trap
    began = time.monotonic()
    assert engine.client.post(f"/containers/{handled}/stop", params={"t": "30"}).is_success
    assert time.monotonic() - began < 20  # ended by SIGTERM, not the timeout's SIGKILL
    assert engine.inspect(handled)["State"]["ExitCode"] == 143


def test_a_command_that_exits_by_itself(engine: Engine, request: pytest.FixtureRequest) -> None:
    name = name_for(request, "exit")
    body = engine.body(["/bin/sh", "-c", "echo bye; exit 3"])
    assert engine.client.post("/containers/create", params={"name": name}, json=body).is_success
    assert engine.client.post(f"/containers/{name}/start").status_code == 204
    state = engine.settle(name, lambda s: s["Status"] == "exited")
    assert (state["ExitCode"], state["Running"], state["Pid"]) == (3, False, 0)
