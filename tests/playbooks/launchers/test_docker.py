"""The docker launcher: the Engine's log framing, what a recreated container keeps, the
interrupted swap, and the errors an operator can act on."""

from __future__ import annotations

import io
import json
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.cli import main
from playbooks.engines.sglang.allow_list import with_change
from playbooks.launchers.base import LaunchError
from playbooks.launchers.docker import (
    DockerLauncher,
    DockerSpec,
    demultiplex,
    recreate_body,
)
from tests.playbooks.launchers.fake_docker import FakeDockerEngine, Image
from tests.playbooks.launchers.harness import IMAGE, Harness, docker_harness
from tests.playbooks.launchers.serving import serving


def frame(stream: int, data: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + len(data).to_bytes(4, "big") + data


def test_log_frames_are_joined_in_order() -> None:
    raw = frame(1, b"Load weight end.\n") + frame(
        2, b"torch.OutOfMemoryError: CUDA out of memory\n"
    )
    assert demultiplex(raw) == b"Load weight end.\ntorch.OutOfMemoryError: CUDA out of memory\n"
    assert demultiplex(raw + b"\x01\x00\x00") == demultiplex(raw)  # a cut-off header is dropped


INSPECTED: dict[str, Any] = {
    "Id": "0123456789ab" + "c" * 52,
    "Name": "/sglang",
    "Image": "sha256:" + "ab" * 32,
    "Config": {
        "Hostname": "0123456789ab",
        "Image": "lmsysorg/sglang:latest",
        "Entrypoint": ["python3", "-m", "sglang.launch_server"],
        "Cmd": ["--model-path", "/models/m", "--mem-fraction-static", "0.85"],
        "Env": ["HF_TOKEN=x"],
        "Labels": {"com.docker.compose.service": "sglang"},
    },
    "HostConfig": {"NetworkMode": "llm", "Binds": ["/models:/models:ro"], "ShmSize": 1 << 35},
    "NetworkSettings": {
        "Networks": {"llm": {"Aliases": ["sglang", "0123456789ab"], "IPAMConfig": None}}
    },
}


def test_a_recreated_container_keeps_everything_but_the_flags() -> None:
    body = recreate_body(INSPECTED, ["--model-path", "/models/m", "--mem-fraction-static", "0.88"])
    assert body["Image"] == INSPECTED["Image"]  # the same bits, even if the tag moved since
    assert body["Entrypoint"] == ["python3", "-m", "sglang.launch_server"]
    assert body["Cmd"][-1] == "0.88"
    assert "Hostname" not in body  # Docker's default (the old ID) is not carried over
    assert body["HostConfig"] == INSPECTED["HostConfig"]
    assert body["Env"] == ["HF_TOKEN=x"] and body["Labels"] == INSPECTED["Config"]["Labels"]
    assert body["NetworkingConfig"] == {"EndpointsConfig": {"llm": {"Aliases": ["sglang"]}}}
    held = {
        **INSPECTED,
        "Config": {**INSPECTED["Config"], "Entrypoint": ["sh"], "Cmd": ["-c", "x"]},
    }
    with pytest.raises(LaunchError, match="no SGLang --flags"):
        recreate_body(held, ["--port", "1"])


@pytest.fixture
def docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    with docker_harness(tmp_path, monkeypatch) as h:
        yield h


def test_apply_recreates_with_the_same_image_mounts_devices_and_environment(
    docker: Harness,
) -> None:
    engine: FakeDockerEngine = docker.extra["engine"]
    before = engine.inspect(engine.find("sglang"))
    launcher = docker.launcher()
    trial = with_change(docker.baseline, {"mem_fraction_static": 0.88})
    engine.calls.clear()
    launcher.apply(trial)
    after = engine.inspect(engine.find("sglang"))
    assert after["Id"] != before["Id"] and after["Image"] == before["Image"]
    # The swap, in the order that keeps a crash anywhere recoverable (module docstring).
    changes = [
        f"{method} {path}".replace(before["Id"], "OLD").replace(after["Id"], "NEW")
        for method, path in engine.calls
        if method != "GET"
    ]
    assert changes == [
        "DELETE /containers/sglang-kvpilot-next?force=true",
        "POST /containers/create?name=sglang-kvpilot-next",
        "POST /containers/OLD/stop?t=10",
        "DELETE /containers/sglang-kvpilot-previous?force=true",
        "POST /containers/OLD/rename?name=sglang-kvpilot-previous",
        "POST /containers/NEW/rename?name=sglang",
        "POST /containers/NEW/start",
        "DELETE /containers/sglang-kvpilot-previous?force=true",
    ]
    for key in ("Binds", "DeviceRequests", "IpcMode", "ShmSize", "NetworkMode", "Ulimits"):
        assert after["HostConfig"][key] == before["HostConfig"][key], key
    for key in ("Env", "WorkingDir", "Labels"):
        assert after["Config"][key] == before["Config"][key], key
    assert after["Config"]["Cmd"][3:] == trial
    assert after["Mounts"] == before["Mounts"]
    assert engine.names() == ["sglang"]
    assert docker.info()["mem_fraction_static"] == 0.88

    # Killed between the two renames: only NAME-kvpilot-previous (stopped) and a created
    # NAME-kvpilot-next are left. A new launcher reads the previous one and recovers.
    assert isinstance(launcher, DockerLauncher)
    socket = launcher.spec.socket
    with httpx.Client(transport=httpx.HTTPTransport(uds=socket), base_url="http://d") as api:
        assert api.post("/containers/sglang/stop").status_code == 204
        assert api.post("/containers/sglang/rename?name=sglang-kvpilot-previous").status_code == 204
        created = api.post(
            "/containers/create?name=sglang-kvpilot-next",
            json={"Image": after["Image"], "Cmd": ["python3", "-m", "never.started"]},
        )
        assert created.status_code == 201
    fresh = docker.launcher()
    assert fresh.current_args() == trial
    assert not fresh.state().running
    fresh.apply(docker.baseline)
    assert engine.names() == ["sglang"]
    assert docker.info()["mem_fraction_static"] == 0.85


class Killed(Exception):
    """The bot killed at one line of the swap."""


def test_killed_between_the_last_rename_and_the_start_the_container_is_started(
    docker: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NAME is the new container, created and never started: the resumed bot starts it instead
    of waiting out its deadline for a server nothing will start (and, in a revert, giving up
    with the server down)."""
    engine: FakeDockerEngine = docker.extra["engine"]
    launcher = docker.launcher()
    assert isinstance(launcher, DockerLauncher)
    trial = with_change(docker.baseline, {"mem_fraction_static": 0.88})

    def killed(ident: str) -> None:
        raise Killed(ident)

    monkeypatch.setattr(launcher.engine, "start", killed)
    with pytest.raises(Killed):
        launcher.issue(trial)
    assert engine.inspect(engine.find("sglang"))["State"]["Status"] == "created"
    fresh = docker.launcher()
    assert fresh.current_args() == trial
    fresh.wait_ready()
    assert docker.info()["mem_fraction_static"] == 0.88
    assert engine.names() == ["sglang"]


def test_errors_an_operator_can_act_on(tmp_path: Path) -> None:
    gone = DockerLauncher(
        DockerSpec("sglang", "http://127.0.0.1:9", socket=str(tmp_path / "x.sock"))
    )
    with pytest.raises(LaunchError, match=r"cannot reach the Docker Engine.*docker group"):
        gone.current_args()
    engine = FakeDockerEngine([])
    socket = str(tmp_path / "d.sock")
    with serving(engine.app(), uds=socket):
        missing = DockerLauncher(DockerSpec("sglang", "http://127.0.0.1:9", socket=socket))
        with pytest.raises(LaunchError, match=r"no container named 'sglang'.*docker run --name"):
            missing.current_args()
        assert "no container named" in missing.state().reason
        engine.images["img"] = Image("img", "sha256:" + "1" * 64)
        engine.create(
            "sglang",
            {"Image": "img", "Cmd": ["x", "--port", "1"], "HostConfig": {"AutoRemove": True}},
        )
        with pytest.raises(LaunchError, match="started with --rm"):
            missing.apply(["--port", "2"])


def test_kvpilot_server_commands_drive_the_container(docker: Harness) -> None:
    def cli(*args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = main(["server", *args, "--server", "twin", "--config", str(docker.config)], out, err)
        return code, out.getvalue(), err.getvalue()

    code, out, _ = cli("status", "--json")
    status = json.loads(out)
    assert code == 0 and status["running"] and status["ready"] and status["args"] == docker.baseline
    assert cli("stop") == (0, "twin stopped\n", "")
    code, out, _ = cli("status", "-o", "json")
    assert code == 1 and not json.loads(out)["running"]  # 1: it does not serve
    code, out, _ = cli("status")
    assert code == 1 and out.startswith("twin: down"), out
    code, out, _ = cli("start")
    assert code == 0 and out == f"twin is ready at {docker.url}\n"
    assert docker.info()["mem_fraction_static"] == 0.85
    engine: FakeDockerEngine = docker.extra["engine"]
    engine.remove(engine.find("sglang"), force=True)
    for command in ("status", "start"):
        code, _, err = cli(command)
        assert code == 1 and err.startswith("error: no container named 'sglang'"), err


# The Engine API v1.41 (moby docs/api/v1.41.yaml): ContainerInspectResponse and ContainerState
# fields the launcher reads or passes back, with their JSON types.
INSPECT_FIELDS = {
    "Id": str,
    "Created": str,
    "Path": str,
    "Args": list,
    "State": dict,
    "Image": str,
    "Name": str,
    "RestartCount": int,
    "HostConfig": dict,
    "Mounts": list,
    "Config": dict,
    "NetworkSettings": dict,
}
STATE_FIELDS = {
    "Status": str,
    "Running": bool,
    "Paused": bool,
    "Restarting": bool,
    "OOMKilled": bool,
    "Dead": bool,
    "Pid": int,
    "ExitCode": int,
    "Error": str,
    "StartedAt": str,
    "FinishedAt": str,
}


def test_the_fake_engine_answers_with_the_apis_shapes(tmp_path: Path) -> None:
    engine = FakeDockerEngine([Image("img:1", "sha256:" + "2" * 64)])
    socket = str(tmp_path / "d.sock")
    with (
        serving(engine.app(), uds=socket),
        httpx.Client(transport=httpx.HTTPTransport(uds=socket), base_url="http://d/v1.41") as api,
    ):
        created = api.post("/containers/create", params={"name": "sglang"}, json={"Image": "img:1"})
        assert created.status_code == 201 and set(created.json()) == {"Id", "Warnings"}
        info = api.get("/containers/sglang/json").json()
        for key, kind in INSPECT_FIELDS.items():
            assert isinstance(info[key], kind), key
        for key, kind in STATE_FIELDS.items():
            assert isinstance(info["State"][key], kind), key
        assert info["Name"] == "/sglang" and info["State"]["Status"] == "created"
        bad = api.post("/containers/create", params={"name": "sglang"}, json={"Image": "img:1"})
        assert bad.status_code == 409 and "is already in use" in bad.json()["message"]
        missing = api.get("/containers/nope/json")
        assert missing.status_code == 404 and missing.json() == {
            "message": "No such container: nope"
        }
        assert api.post("/containers/sglang/stop").status_code == 304  # not running
        assert (
            api.post(
                "/containers/create", params={"name": "a b"}, json={"Image": "img:1"}
            ).status_code
            == 400
        )


SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)", "--mem-fraction-static", "0.85"]


def test_a_container_is_created_on_one_network_at_the_launchers_api_version(
    tmp_path: Path,
) -> None:
    """Docker before API 1.44 refuses a create naming several networks (moby's
    `verifyNetworkingConfig`); the others are connected one by one, as `docker network connect`
    does. The fake holds that rule, so a launcher that skipped the connects cannot pass."""
    socket = str(Path(tempfile.mkdtemp(prefix="kvd-")) / "d.sock")
    engine = FakeDockerEngine([IMAGE])
    with serving(engine.app(), uds=socket), _api(socket) as api:
        two: dict[str, Any] = {"EndpointsConfig": {"backend": {}, "frontend": {}}}
        body = {"Image": IMAGE.ref, "Cmd": SLEEPER, "NetworkingConfig": two}
        refused = api.post("/containers/create", params={"name": "two-nets"}, json=body)
        assert refused.status_code == 400
        assert "cannot be connected to network endpoints" in refused.json()["message"]


@pytest.mark.parametrize("mode", ["backend", "default"])
def test_a_recreated_container_is_on_every_network_it_was_on(tmp_path: Path, mode: str) -> None:
    """A compose service on two networks (or one connected to a second later): the copy with
    the new flags is on both, with their aliases and fixed addresses, or clients on the other
    network lose the server while kvpilot, reading it on its URL, sees it ready."""
    socket = str(Path(tempfile.mkdtemp(prefix="kvd-")) / "d.sock")
    engine = FakeDockerEngine([IMAGE])
    with serving(engine.app(), uds=socket):
        with _api(socket) as api:
            body: dict[str, Any] = {
                "Image": IMAGE.ref,
                "Cmd": SLEEPER,
                "HostConfig": {"NetworkMode": mode},
            }
            if mode != "default":
                body["NetworkingConfig"] = {"EndpointsConfig": {mode: {"Aliases": ["llm"]}}}
            assert api.post("/containers/create", params={"name": "sglang"}, json=body).is_success
            connected = api.post(
                "/networks/frontend/connect",
                json={
                    "Container": "sglang",
                    "EndpointConfig": {
                        "Aliases": ["api"],
                        "IPAMConfig": {"IPv4Address": "172.20.0.9"},
                    },
                },
            )
            assert connected.status_code == 200, connected.text
            assert api.post("/containers/sglang/start").status_code == 204
        before = engine.inspect(engine.find("sglang"))["NetworkSettings"]["Networks"]
        spec = DockerSpec("sglang", "http://127.0.0.1:9", socket=socket, stop_timeout_s=1)
        try:
            DockerLauncher(spec).issue(["--mem-fraction-static", "0.88"])
            after = engine.inspect(engine.find("sglang"))
        finally:
            engine.shutdown()
    assert after["Config"]["Cmd"][-1] == "0.88"
    networks = after["NetworkSettings"]["Networks"]
    assert set(networks) == set(before) == {"bridge" if mode == "default" else mode, "frontend"}
    assert networks["frontend"]["IPAMConfig"] == {"IPv4Address": "172.20.0.9"}
    assert "api" in networks["frontend"]["Aliases"]
    if mode != "default":
        assert "llm" in networks[mode]["Aliases"]


@contextmanager
def _api(socket: str) -> Iterator[httpx.Client]:
    with httpx.Client(
        transport=httpx.HTTPTransport(uds=socket), base_url="http://docker/v1.41"
    ) as api:
        yield api
