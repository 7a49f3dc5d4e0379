"""The twin in a container of the real Docker Engine, set up as an operator would with
`docker run --gpus all --ipc host --shm-size 32g --network host ...`, for the launcher contract.

The image is an empty root file system (no registry here); the host's system, its Python and
the checkout are mounted read-only, so the container runs the twin from this checkout.
"""

from __future__ import annotations

import json
import resource
import secrets
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.playbooks.launchers.harness import Harness, twin_args, twin_command, write_config
from tests.ports import free_port
from tests.real_daemons.dockerd import BASE_IMAGE, Dockerd
from tests.twin_process import REPO

LABEL = "org.kvpilot.test"
MEMLOCK = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
READ_ONLY = ["/usr", "/lib", "/lib64", "/bin", "/etc"]


def mounts() -> list[str]:
    """The host's system, the Python behind the virtual environment, and the checkout."""
    paths = [p for p in READ_ONLY if Path(p).exists()]
    paths += [sys.base_prefix, str(REPO)]
    return [f"{p}:{p}:ro" for p in dict.fromkeys(paths)]


def create_body(args: list[str], label: str, engine: str = "sglang") -> dict[str, Any]:
    """What `docker run -d --gpus all --ipc host --shm-size 32g --network host ...` sends."""
    return {
        "Image": BASE_IMAGE,
        "Cmd": [*twin_command(engine), *args],
        "Env": [f"PYTHONPATH={REPO}", "PYTHONDONTWRITEBYTECODE=1", "PATH=/usr/bin:/bin"],
        "WorkingDir": str(REPO),
        "Labels": {LABEL: label, "org.example.service": "sglang"},
        "HostConfig": {
            "Binds": mounts(),
            "NetworkMode": "host",
            "IpcMode": "host",
            "ShmSize": 32 * 1024**3,
            "DeviceRequests": [
                {"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]]}
            ],
            # production asks for an unlimited memlock; these machines may not raise the hard
            # limit (runc: "error setting rlimit type 8: operation not permitted"), so the
            # host's own limit stands in: the field is still sent and applied
            "Ulimits": [{"Name": "memlock", "Soft": MEMLOCK, "Hard": MEMLOCK}],
            "RestartPolicy": {"Name": "no", "MaximumRetryCount": 0},
        },
    }


@contextmanager
def real_docker_harness(
    tmp: Path, monkeypatch: pytest.MonkeyPatch, daemon: Dockerd, engine: str = "sglang"
) -> Iterator[Harness]:
    port = free_port()
    args = twin_args(port, engine=engine)
    name = f"kvpilot-twin-{secrets.token_hex(4)}"
    since = int(time.time()) - 1
    with daemon.client() as docker:

        def ours() -> list[dict[str, Any]]:
            query = {"all": "1", "filters": json.dumps({"label": [f"{LABEL}={name}"]})}
            listed = docker.get("/containers/json", params=query)
            assert listed.status_code == 200, listed.text
            return list(listed.json())

        def leftovers() -> list[str]:
            names = [n.lstrip("/") for c in ours() for n in c["Names"]]
            return [n for n in names if n != name]

        def starts() -> int:
            """Starts of the test's containers, as the daemon's event log records them."""
            query = {
                "since": str(since),
                "until": str(int(time.time()) + 1),
                "filters": json.dumps({"label": [f"{LABEL}={name}"], "event": ["start"]}),
            }
            events = docker.get("/events", params=query, timeout=30)
            return sum(1 for line in events.text.splitlines() if line.strip())

        created = docker.post(
            "/containers/create", params={"name": name}, json=create_body(args, name, engine)
        )
        assert created.status_code == 201, created.text
        try:
            started = docker.post(f"/containers/{name}/start")
            assert started.status_code == 204, started.text
            config = write_config(
                tmp / "kvpilot.toml",
                port,
                f'kind = "docker"\ncontainer = "{name}"\nsocket = "{daemon.socket}"\n'
                "stop_timeout_s = 10\n",
                engine,
            )
            h = Harness("docker-real", config, port, args, lambda: None, leftovers, starts)
            h.server_pid = lambda: h.launcher().state().pid
            h.extra.update(daemon=daemon, name=name)
            h.launcher().wait_ready()
            yield h
        finally:
            for c in ours():
                docker.delete(f"/containers/{c['Id']}", params={"force": "1"})
