"""One SGLang twin behind each kind of launcher, set up as an operator would, for the contract.

Every harness writes a kvpilot.toml and builds its launchers through the configuration and the
wiring, as the bot does, so a fresh launcher is what a restarted bot would have. The twin is
always the server; around it:
- process: kvpilot's own child process;
- systemd: a unit file (and kvpilot's drop-ins) run by the fake manager behind `systemctl` and
  `journalctl` on PATH;
- docker: a container created through the Engine API on a Unix socket;
- kubernetes: a Deployment on the fake API server, reached with a kubeconfig, under the Role of
  deploy/kubernetes/rbac.yaml.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bot.app.config import load
from bot.app.wiring import launcher as build_launcher
from playbooks.clock import ScaledClock
from playbooks.launchers.common import ManagedLauncher
from playbooks.launchers.kube_objects import expected_pods, replicas, server_args, templates
from tests.playbooks.launchers import fake_systemd
from tests.playbooks.launchers.fake_docker import FakeDockerEngine, Image
from tests.playbooks.launchers.fake_kubernetes import FakeCluster
from tests.playbooks.launchers.serving import serving
from tests.ports import free_port
from tests.twin_process import REPO

SCALE = 200  # the twin's --time-scale: a 45 s model load takes a quarter of a second
# The launchers' clock runs slower than the twin's, so that waiting polls every 0.125 s of wall
# time (every 5 s on the clock) rather than 40 times a second.
CLOCK_SCALE = 40
READY_TIMEOUT = 30 * CLOCK_SCALE  # 30 wall seconds
PRESET = "llama-3.1-8b-h100"
TWIN = [sys.executable, "-m", "sim.launch_server"]
IMAGE = Image("lmsysorg/sglang:v0.5.23", "sha256:" + "5e" * 32, env=["PATH=/usr/bin"])
RBAC = REPO / "deploy/kubernetes/rbac.yaml"


# The vLLM twin as `vllm serve` (its preset's model): the launchers edit its flags as vLLM's.
VLLM_TWIN = [sys.executable, "-m", "sim.vllm", "serve"]


def twin_command(engine: str = "sglang") -> list[str]:
    return list(VLLM_TWIN if engine == "vllm" else TWIN)


def twin_args(
    port: int, fraction: str = "0.85", scale: int = SCALE, engine: str = "sglang"
) -> list[str]:
    if engine == "vllm":
        return [
            "--preset", PRESET, "--port", str(port), "--gpu-memory-utilization", "0.9",
            "--time-scale", str(scale),
        ]  # fmt: skip
    return [
        "--preset",
        PRESET,
        "--port",
        str(port),
        "--mem-fraction-static",
        fraction,
        "--time-scale",
        str(scale),
        "--enable-metrics",
    ]


def role_rules() -> list[dict[str, Any]]:
    docs = list(yaml.safe_load_all(RBAC.read_text()))
    (role,) = [d for d in docs if d["kind"] == "Role"]
    return list(role["rules"])


@dataclass
class Harness:
    kind: str
    config: Path
    port: int
    baseline: list[str]
    server_pid: Callable[[], int | None]
    leftovers: Callable[[], list[str]]  # what is there besides the one server (should be none)
    # How many times the system has started the server so far, as the system records it
    # (process logs, unit invocations, container creations, container runs in pods).
    starts: Callable[[], int]
    exit_status_seen: bool = True  # the system records how the server ended
    extra: dict[str, Any] = field(default_factory=dict)
    # the output of the server started last, as the system keeps it (log file, journal,
    # container log, pod log)
    server_log: Callable[[], str] = lambda: ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launcher(self, ready_timeout_s: float | None = None) -> ManagedLauncher:
        """A new launcher, as a restarted bot builds it (with another `ready_timeout_s`)."""
        config = load(str(self.config))
        server = config.server("twin")
        if ready_timeout_s is not None and server.launcher is not None:
            faster = replace(server.launcher, ready_timeout_s=ready_timeout_s)
            server = replace(server, launcher=faster)
        return build_launcher(config, server, ScaledClock(CLOCK_SCALE))

    def info(self) -> dict[str, Any]:
        return dict(httpx.get(self.url + "/server_info", timeout=10).json())


def newest_text(folder: Path, pattern: str) -> str:
    """The newest file matching `pattern` in `folder`, as text ("" when there is none)."""
    found = sorted(folder.glob(pattern), key=lambda p: p.stat().st_mtime)
    return found[-1].read_text(errors="replace") if found else ""


def write_config(path: Path, port: int, launcher: str, engine: str = "sglang") -> Path:
    path.write_text(
        f'[kvpilot]\nstate_dir = "state"\ntime_scale = {CLOCK_SCALE}\n\n'
        f'[servers.twin]\nurl = "http://127.0.0.1:{port}"\nengine = "{engine}"\n\n'
        f"[servers.twin.launcher]\nready_timeout_s = {READY_TIMEOUT}\n{launcher}"
    )
    return path


# --------------------------------------------------------------------------- process
@contextmanager
def process_harness(
    tmp: Path, monkeypatch: pytest.MonkeyPatch, engine: str = "sglang"
) -> Iterator[Harness]:
    port = free_port()
    args = twin_args(port, engine=engine)
    config = write_config(
        tmp / "kvpilot.toml",
        port,
        f'kind = "process"\ncommand = {json.dumps([*twin_command(engine), *args])}\n'
        f"env = {{ PYTHONPATH = {json.dumps(str(REPO))} }}\n",
        engine,
    )
    # the process launcher writes a new log file for every server process it starts
    h = Harness(
        "process",
        config,
        port,
        args,
        lambda: None,
        list,
        starts=lambda: len(list((tmp / "state").glob("twin-*.log"))),
        exit_status_seen=False,
    )
    owner = h.launcher()
    h.server_pid = lambda: owner.state().pid
    h.server_log = lambda: newest_text(tmp / "state", "twin-*.log")
    owner.start(args)
    try:
        owner.wait_ready()
        yield h
    finally:
        h.launcher().stop()


# --------------------------------------------------------------------------- systemd
UNIT = "sglang-twin.service"


def unit_text(args: list[str], engine: str = "sglang") -> str:
    return (
        "[Unit]\nDescription=SGLang server (the twin)\nAfter=network-online.target\n\n"
        "[Service]\nType=simple\n"
        f"WorkingDirectory={REPO}\n"
        f"ExecStart={shlex.join([*twin_command(engine), *args])}\n"
        "Restart=on-failure\nRestartSec=30\nTimeoutStopSec=10\n\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )


@contextmanager
def systemd_harness(
    tmp: Path, monkeypatch: pytest.MonkeyPatch, engine: str = "sglang"
) -> Iterator[Harness]:
    port = free_port()
    args = twin_args(port, engine=engine)
    root, bin_dir = tmp / "host", tmp / "bin"
    fake_systemd.unit_dir(root).mkdir(parents=True)
    (fake_systemd.unit_dir(root) / UNIT).write_text(unit_text(args, engine))
    fake_systemd.install_tools(root, bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for step in (["daemon-reload"], ["start", UNIT]):
        subprocess.run(["systemctl", *step], check=True)
    config = write_config(
        tmp / "kvpilot.toml",
        port,
        f'kind = "systemd"\nunit = "{UNIT}"\ndropin_dir = "{fake_systemd.etc_dir(root)}"\n',
        engine,
    )

    def leftovers() -> list[str]:
        dropins = sorted(p.name for p in fake_systemd.etc_dir(root).glob(f"{UNIT}.d/*"))
        return [f"drop-in {d}" for d in dropins if d != "90-kvpilot.conf"]

    def invocations() -> int:
        lines = (root / "journal.jsonl").read_text().splitlines()
        entries = [json.loads(line) for line in lines]
        started = fake_systemd.MESSAGE_IDS["started"]
        return len({e["INVOCATION_ID"] for e in entries if e.get("MESSAGE_ID") == started})

    def journal_text() -> str:
        lines = (root / "journal.jsonl").read_text().splitlines()
        return "\n".join(str(json.loads(line).get("MESSAGE", "")) for line in lines)

    h = Harness("systemd", config, port, args, lambda: None, leftovers, invocations)
    h.server_pid = lambda: h.launcher().state().pid
    h.server_log = journal_text
    h.extra["root"] = root
    try:
        h.launcher().wait_ready()
        yield h
    finally:
        fake_systemd.stop_all(root)


# --------------------------------------------------------------------------- docker
def create_container(socket: str, name: str, args: list[str], engine: str = "sglang") -> None:
    """What `docker run -d --name NAME --gpus all --ipc host --network host -v ... IMAGE CMD`
    asks of the Engine."""
    body = {
        "Image": IMAGE.ref,
        "Cmd": [*twin_command(engine), *args],
        "Env": ["HF_HOME=/models/hf", f"PYTHONPATH={REPO}"],
        "WorkingDir": str(REPO),
        "Labels": {"org.example.service": "sglang"},
        "HostConfig": {
            "Binds": ["/models:/models:ro"],
            "NetworkMode": "host",
            "IpcMode": "host",
            "ShmSize": 32 * 1024**3,
            "DeviceRequests": [
                {"Driver": "", "Count": -1, "DeviceIDs": None, "Capabilities": [["gpu"]]}
            ],
            "Ulimits": [{"Name": "memlock", "Soft": -1, "Hard": -1}],
            "RestartPolicy": {"Name": "no", "MaximumRetryCount": 0},
        },
    }
    transport = httpx.HTTPTransport(uds=socket)
    with httpx.Client(transport=transport, base_url="http://docker/v1.41") as docker:
        created = docker.post("/containers/create", params={"name": name}, json=body)
        assert created.status_code == 201, created.text
        assert docker.post(f"/containers/{name}/start").status_code == 204


@contextmanager
def docker_harness(
    tmp: Path, monkeypatch: pytest.MonkeyPatch, engine: str = "sglang"
) -> Iterator[Harness]:
    port = free_port()
    args = twin_args(port, engine=engine)
    short = Path(tempfile.mkdtemp(prefix="kvd-"))  # Unix socket paths are limited to 107 bytes
    socket = str(short / "docker.sock")
    daemon = FakeDockerEngine([IMAGE])
    try:
        with serving(daemon.app(), uds=socket):
            create_container(socket, "sglang", args, engine)
            config = write_config(
                tmp / "kvpilot.toml",
                port,
                f'kind = "docker"\ncontainer = "sglang"\nsocket = "{socket}"\n'
                "stop_timeout_s = 10\n",
                engine,
            )

            def leftovers() -> list[str]:
                return [n for n in daemon.names() if n != "sglang"]

            def creations() -> int:
                return sum(
                    1
                    for method, path in daemon.calls
                    if method == "POST" and path.startswith("/containers/create")
                )

            def container_log() -> str:
                c = daemon.find("sglang")
                with c.lock:
                    return b"".join(data for _, data in c.frames).decode(errors="replace")

            h = Harness("docker", config, port, args, lambda: None, leftovers, creations)
            h.server_pid = lambda: h.launcher().state().pid
            h.server_log = container_log
            h.extra["engine"] = daemon
            try:
                h.launcher().wait_ready()
                yield h
            finally:
                daemon.shutdown()
    finally:
        shutil.rmtree(short, ignore_errors=True)


# --------------------------------------------------------------------------- kubernetes
def deployment(
    args: list[str], port: int, kind: str = "Deployment", engine: str = "sglang"
) -> dict[str, Any]:
    container = {
        "name": "sglang",
        "image": IMAGE.ref,
        "command": twin_command(engine),
        "args": args,
        "workingDir": str(REPO),
        "env": [{"name": "PYTHONPATH", "value": str(REPO)}],
        "ports": [{"name": "http", "containerPort": port}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": port}, "periodSeconds": 5},
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
        "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
    }
    spec: dict[str, Any] = {
        "replicas": 1,
        "selector": {"matchLabels": {"app": "sglang"}},
        "template": {
            "metadata": {"labels": {"app": "sglang"}},
            "spec": {
                "containers": [container],
                "volumes": [{"name": "models", "hostPath": {"path": "/models"}}],
                "terminationGracePeriodSeconds": 5,
            },
        },
    }
    if kind == "Deployment":
        spec["strategy"] = {"type": "Recreate"}
    else:
        spec["serviceName"] = "sglang"
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": "sglang", "namespace": "sglang", "labels": {"app": "sglang"}},
        "spec": spec,
    }


def leaderworkerset(args: list[str], port: int) -> dict[str, Any]:
    """A group of two: the leader serves HTTP on `port`, the worker on a port of its own; the
    arguments use the environment variables the LeaderWorkerSet controller injects."""
    shared = [
        *(a if a != str(port) else "$(SGLANG_PORT)" for a in args),
        "--nnodes",
        "$(LWS_GROUP_SIZE)",
        "--node-rank",
        "$(LWS_WORKER_INDEX)",
        "--dist-init-addr",
        "$(LWS_LEADER_ADDRESS):20000",
    ]

    def container(serve_port: int, extra: list[str]) -> dict[str, Any]:
        return {
            "name": "sglang",
            "image": IMAGE.ref,
            "command": list(TWIN),
            "args": [*shared, *extra],
            "workingDir": str(REPO),
            "env": [
                {"name": "SGLANG_PORT", "value": str(serve_port)},
                {"name": "PYTHONPATH", "value": str(REPO)},
            ],
        }

    leader = container(port, [])
    leader["readinessProbe"] = {"httpGet": {"path": "/health", "port": port}}
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "sglang", "namespace": "sglang"},
        "spec": {
            "replicas": 1,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": 2,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {
                    "metadata": {"labels": {"role": "leader"}},
                    "spec": {"containers": [leader]},
                },
                "workerTemplate": {
                    "metadata": {"labels": {"role": "worker"}},
                    "spec": {"containers": [container(free_port(), ["--skip-server-warmup"])]},
                },
            },
        },
    }


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "gpu-cluster", "cluster": {"server": server}}],
                "users": [{"name": "kvpilot", "user": {"token": "kvpilot-service-account-token"}}],
                "contexts": [
                    {
                        "name": "kvpilot",
                        "context": {
                            "cluster": "gpu-cluster",
                            "user": "kvpilot",
                            "namespace": "sglang",
                        },
                    }
                ],
                "current-context": "kvpilot",
            }
        )
    )
    return path


@contextmanager
def kubernetes_harness(
    tmp: Path,
    monkeypatch: pytest.MonkeyPatch,
    obj: Callable[[list[str], int], dict[str, Any]] = deployment,
    backoff_s: float = 10.0,
    engine: str = "sglang",
) -> Iterator[Harness]:
    tmp.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cluster = FakeCluster(rules=role_rules(), restart_backoff_s=backoff_s)
    served = twin_args(port, engine=engine)
    # another engine's server runs in a Deployment (the SGLang twin in any workload kind)
    workload = obj(served, port) if engine == "sglang" else deployment(served, port, engine=engine)
    args = server_args(templates(workload["kind"], workload, "sglang", None)[0])
    cluster.add(workload)
    try:
        with serving(cluster.app()) as url:
            config = write_config(
                tmp / "kvpilot.toml",
                port,
                f'kind = "kubernetes"\nworkload = "{workload["kind"]}"\nname = "sglang"\n'
                f'namespace = "sglang"\ncontainer = "sglang"\n'
                f'kubeconfig = "{kubeconfig(tmp / "kubeconfig.yaml", url)}"\n',
                engine,
            )
            want = expected_pods(workload["kind"], workload)

            def leftovers() -> list[str]:
                names = cluster.pod_names()
                return [] if len(names) == want else names

            h = Harness(
                workload["kind"].lower(),
                config,
                port,
                args,
                lambda: None,
                leftovers,
                cluster.container_runs,
            )
            h.server_pid = lambda: cluster.pids()[0]
            h.server_log = lambda: newest_text(cluster.logs, "*.log")
            h.extra["cluster"] = cluster
            if replicas(workload):
                h.launcher().wait_ready()
            yield h
    finally:
        cluster.shutdown()


# Each takes (tmp, monkeypatch) and `engine=` ("sglang" or "vllm").
HARNESSES: dict[str, Callable[..., AbstractContextManager[Harness]]] = {
    "process": process_harness,
    "systemd": systemd_harness,
    "docker": docker_harness,
    "kubernetes": kubernetes_harness,
}
