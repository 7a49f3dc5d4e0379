"""A Docker Engine stand-in on a Unix socket: the container endpoints the docker launcher uses.

Request and response shapes follow the Engine API (v1.41): `GET /containers/{id}/json` (inspect),
`POST /containers/create?name=`, `/start` (204, 304 when running), `/stop?t=` (SIGTERM, then
SIGKILL after t seconds; 204, 304 when stopped), `/rename?name=`, `DELETE /containers/{id}?force=`,
`GET /containers/{id}/logs` with the 8-byte stream framing of a container without a TTY, and
errors as `{"message": ...}` with Docker's status codes and wording. Containers are named or
addressed by ID or unique ID prefix, optionally behind a `/vX.Y` path prefix.

A "container" is a real process on this host running Entrypoint + Cmd with the image's and the
container's environment and working directory (tests run the SGLang twin in it). Networking is
the host's, so ports are the process's own. Restart policies are stored but not acted on.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

NEVER = "0001-01-01T00:00:00Z"


def now_iso() -> str:
    """Now as the Engine writes times: Go's RFC3339Nano in UTC, nanoseconds with trailing
    zeros dropped ("2024-05-14T10:21:03.12345678Z")."""
    ns = time.time_ns()
    whole = datetime.fromtimestamp(ns // 10**9, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    fraction = f"{ns % 10**9:09d}".rstrip("0")
    return f"{whole}.{fraction}Z" if fraction else f"{whole}Z"


def handles(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (the SigCgt mask of /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    found = re.search(r"^SigCgt:\s*([0-9a-f]+)$", status, re.MULTILINE)
    return found is not None and bool(int(found.group(1), 16) >> (signum - 1) & 1)


class EngineError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Image:
    ref: str
    id: str
    env: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)


@dataclass
class Container:
    id: str
    name: str
    created: str
    config: dict[str, Any]
    host_config: dict[str, Any]
    endpoints: dict[str, Any]
    image: Image
    state: dict[str, Any]
    proc: subprocess.Popen[bytes] | None = None
    frames: list[tuple[int, bytes]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def argv(self) -> list[str]:
        return list(self.config.get("Entrypoint") or []) + list(self.config.get("Cmd") or [])


class FakeDockerEngine:
    def __init__(self, images: list[Image]) -> None:
        self.images = {img.ref: img for img in images} | {img.id: img for img in images}
        self.containers: dict[str, Container] = {}
        self.calls: list[tuple[str, str]] = []
        self.lock = threading.RLock()

    # ----------------------------------------------------------------- lookups
    def find(self, ref: str) -> Container:
        with self.lock:
            for c in self.containers.values():
                if c.name == ref.lstrip("/") or c.id == ref:
                    return c
            matches = [c for c in self.containers.values() if c.id.startswith(ref)]
            if len(matches) == 1:
                return matches[0]
        raise EngineError(404, f"No such container: {ref}")

    def names(self) -> list[str]:
        with self.lock:
            return sorted(c.name for c in self.containers.values())

    # ----------------------------------------------------------------- operations
    def create(self, name: str, body: dict[str, Any]) -> Container:
        if not re.fullmatch(r"/?[a-zA-Z0-9][a-zA-Z0-9_.-]+", name):
            raise EngineError(
                400, f"Invalid container name ({name}), only [a-zA-Z0-9][a-zA-Z0-9_.-] are allowed"
            )
        ref = body.get("Image")
        if not isinstance(ref, str) or ref not in self.images:
            raise EngineError(404, f"No such image: {ref}")
        for key in ("Cmd", "Entrypoint", "Env"):
            value = body.get(key)
            if value is not None and not (
                isinstance(value, list) and all(isinstance(v, str) for v in value)
            ):
                raise EngineError(400, f"json: cannot unmarshal {key} into a list of strings")
        image = self.images[ref]
        with self.lock:
            if any(c.name == name for c in self.containers.values()):
                other = next(c for c in self.containers.values() if c.name == name)
                raise EngineError(
                    409,
                    f'Conflict. The container name "/{name}" is already in use by container '
                    f'"{other.id}". You have to remove (or rename) that container to be able '
                    "to reuse that name.",
                )
            ident = secrets.token_hex(32)
            env = {e.split("=", 1)[0]: e for e in image.env}
            env |= {e.split("=", 1)[0]: e for e in body.get("Env") or []}
            config = {
                "Hostname": body.get("Hostname") or ident[:12],
                "Domainname": body.get("Domainname", ""),
                "User": body.get("User", ""),
                "AttachStdin": False,
                "AttachStdout": True,
                "AttachStderr": True,
                "ExposedPorts": body.get("ExposedPorts"),
                "Tty": bool(body.get("Tty", False)),
                "OpenStdin": False,
                "StdinOnce": False,
                "Env": list(env.values()),
                "Cmd": body.get("Cmd") if body.get("Cmd") is not None else image.cmd,
                "Image": ref,
                "Volumes": body.get("Volumes"),
                "WorkingDir": body.get("WorkingDir", ""),
                "Entrypoint": body.get("Entrypoint"),
                "OnBuild": None,
                "Labels": body.get("Labels") or {},
                "StopSignal": body.get("StopSignal"),
            }
            host_config = {"NetworkMode": "default", **(body.get("HostConfig") or {})}
            endpoints = ((body.get("NetworkingConfig") or {}).get("EndpointsConfig")) or {}
            if len(endpoints) > 1:  # before API 1.44 (moby's daemon/create.go)
                raise EngineError(
                    400,
                    "Container cannot be connected to network endpoints: " + ", ".join(endpoints),
                )
            mode = str(host_config["NetworkMode"])
            endpoints = endpoints or {"bridge" if mode in ("default", "bridge") else mode: {}}
            container = Container(
                id=ident,
                name=name,
                created=now_iso(),
                config=config,
                host_config=host_config,
                endpoints=endpoints,
                image=image,
                state={
                    "Status": "created",
                    "Running": False,
                    "Paused": False,
                    "Restarting": False,
                    "OOMKilled": False,
                    "Dead": False,
                    "Pid": 0,
                    "ExitCode": 0,
                    "Error": "",
                    "StartedAt": NEVER,
                    "FinishedAt": NEVER,
                },
            )
            self.containers[ident] = container
            return container

    def start(self, c: Container) -> bool:
        with c.lock:
            if c.state["Running"]:
                return False
            env = dict(os.environ)
            env.update(e.split("=", 1) for e in c.config["Env"] if "=" in e)
            try:
                proc = subprocess.Popen(
                    c.argv(),
                    cwd=c.config.get("WorkingDir") or None,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                )
            except OSError as exc:
                c.state.update(Status="exited", ExitCode=127, Error=str(exc), FinishedAt=now_iso())
                raise EngineError(
                    400,
                    "failed to create task for container: failed to create shim task: OCI "
                    f"runtime create failed: exec: {exc}: unknown",
                ) from None
            c.proc = proc
            c.frames = []
            c.state.update(
                Status="running",
                Running=True,
                Pid=proc.pid,
                ExitCode=0,
                Error="",
                StartedAt=now_iso(),
                FinishedAt=NEVER,
            )
        assert proc.stdout is not None and proc.stderr is not None
        readers = [
            threading.Thread(target=self._pump, args=(c, proc.stdout, 1), daemon=True),
            threading.Thread(target=self._pump, args=(c, proc.stderr, 2), daemon=True),
        ]
        for t in readers:
            t.start()
        threading.Thread(target=self._reap, args=(c, proc, readers), daemon=True).start()
        return True

    def _pump(self, c: Container, stream: Any, kind: int) -> None:
        for line in stream:
            with c.lock:
                c.frames.append((kind, line))

    def _reap(self, c: Container, proc: subprocess.Popen[bytes], readers: list[Any]) -> None:
        rc = proc.wait()
        # When PID 1 of a container's namespace ends, the kernel kills every other process in
        # it: the container's children (and their hold on its output) do not outlive it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for t in readers:
            t.join(timeout=5)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        with c.lock:
            if c.proc is proc:
                c.state.update(
                    Status="exited",
                    Running=False,
                    Pid=0,
                    ExitCode=128 - rc if rc < 0 else rc,
                    FinishedAt=now_iso(),
                )

    def stop(self, c: Container, timeout_s: float) -> bool:
        proc = c.proc
        if not c.state["Running"] or proc is None:
            return False
        signame = c.config.get("StopSignal") or "SIGTERM"
        signum = getattr(signal, signame, signal.SIGTERM)
        # The container's main process is PID 1 of its namespace, and the kernel drops a signal
        # whose action is the default there: a process that does not handle SIGTERM lives on
        # until the timeout's SIGKILL (exit 137), as under the real Engine.
        if handles(proc.pid, signum):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signum)
        deadline = time.monotonic() + timeout_s
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        while c.state["Running"]:
            time.sleep(0.005)
        return True

    def remove(self, c: Container, force: bool) -> None:
        if c.state["Running"]:
            if not force:
                raise EngineError(
                    409,
                    f"You cannot remove a running container {c.id}. Stop the container before "
                    "attempting removal or force remove",
                )
            self.stop(c, 0)
        with self.lock:
            self.containers.pop(c.id, None)

    def rename(self, c: Container, name: str) -> None:
        with self.lock:
            if any(o.name == name and o is not c for o in self.containers.values()):
                raise EngineError(
                    409, f"Error when allocating new name: Conflict. The container name "
                    f'"/{name}" is already in use.'
                )  # fmt: skip
            c.name = name

    def connect(self, network: str, c: Container, request: dict[str, Any]) -> None:
        """`POST /networks/NAME/connect`: every network exists here; host, none and another
        container's namespace take no second network, as under dockerd."""
        mode = str(c.host_config.get("NetworkMode"))
        if mode in ("host", "none") or mode.startswith("container:"):
            raise EngineError(  # moby's runconfig.ErrConflictSharedNetwork
                400,
                "container sharing network namespace with another container or host cannot be "
                "connected to any other network",
            )
        with c.lock:
            c.endpoints[network] = request.get("EndpointConfig") or {}

    def inspect(self, c: Container) -> dict[str, Any]:
        argv = c.argv()
        mounts = []
        for bind in c.host_config.get("Binds") or []:
            parts = bind.split(":")
            mode = parts[2] if len(parts) > 2 else ""
            mounts.append(
                {
                    "Type": "bind",
                    "Source": parts[0],
                    "Destination": parts[1],
                    "Mode": mode,
                    "RW": "ro" not in mode.split(","),
                    "Propagation": "rprivate",
                }
            )
        networks = {
            name: {
                "IPAMConfig": ep.get("IPAMConfig"),
                "Links": ep.get("Links"),
                "Aliases": [*(ep.get("Aliases") or []), c.id[:12]],
                "NetworkID": secrets.token_hex(32),
                "EndpointID": secrets.token_hex(32),
                "Gateway": "172.18.0.1",
                "IPAddress": "172.18.0.2",
            }
            for name, ep in c.endpoints.items()
        }
        with c.lock:
            state = dict(c.state)
        return {
            "Id": c.id,
            "Created": c.created,
            "Path": argv[0] if argv else "",
            "Args": argv[1:],
            "State": state,
            "Image": c.image.id,
            "ResolvConfPath": f"/var/lib/docker/containers/{c.id}/resolv.conf",
            "HostnamePath": f"/var/lib/docker/containers/{c.id}/hostname",
            "HostsPath": f"/var/lib/docker/containers/{c.id}/hosts",
            "LogPath": f"/var/lib/docker/containers/{c.id}/{c.id}-json.log",
            "Name": "/" + c.name,
            "RestartCount": 0,
            "Driver": "overlay2",
            "Platform": "linux",
            "MountLabel": "",
            "ProcessLabel": "",
            "AppArmorProfile": "",
            "ExecIDs": None,
            "HostConfig": c.host_config,
            "Mounts": mounts,
            "Config": c.config,
            "NetworkSettings": {"Networks": networks},
        }

    def logs(self, c: Container, tail: str | None) -> bytes:
        with c.lock:
            frames = list(c.frames)
        if tail not in (None, "all"):
            frames = frames[-int(tail) :] if int(tail) else []
        if c.config.get("Tty"):
            return b"".join(data for _, data in frames)
        return b"".join(
            bytes([kind, 0, 0, 0]) + len(data).to_bytes(4, "big") + data for kind, data in frames
        )

    def shutdown(self) -> None:
        with self.lock:
            containers = list(self.containers.values())
        for c in containers:
            self.stop(c, 5)

    # ----------------------------------------------------------------- HTTP
    def app(self) -> Starlette:
        async def endpoint(request: Request) -> Response:
            path = request.url.path
            parts = [p for p in path.split("/") if p]
            if parts and parts[0].startswith("v1."):
                parts = parts[1:]
            body = await request.body()
            query = f"?{request.url.query}" if request.url.query else ""
            self.calls.append((request.method, "/" + "/".join(parts) + query))
            try:
                return await run_in_threadpool(
                    self._route, request.method, parts, dict(request.query_params), body
                )
            except EngineError as exc:
                return JSONResponse({"message": exc.message}, status_code=exc.status)

        return Starlette(
            routes=[Route("/{path:path}", endpoint, methods=["GET", "POST", "DELETE"])]
        )

    def _route(self, method: str, parts: list[str], query: dict[str, str], body: bytes) -> Response:
        if parts == ["_ping"]:  # dockerd names its API version in a header of every answer
            return Response("OK", media_type="text/plain", headers={"Api-Version": "1.41"})
        if method == "POST" and parts == ["containers", "create"]:
            try:
                request = json.loads(body or b"{}")
            except ValueError:
                raise EngineError(400, "invalid JSON in the request body") from None
            name = query.get("name") or secrets.token_hex(6)
            c = self.create(name, request)
            return JSONResponse({"Id": c.id, "Warnings": []}, status_code=201)
        if (
            method == "POST"
            and len(parts) == 3
            and parts[0] == "networks"
            and parts[2] == "connect"
        ):
            request = json.loads(body or b"{}")
            self.connect(parts[1], self.find(str(request.get("Container"))), request)
            return Response(status_code=200)
        if len(parts) < 2 or parts[0] != "containers":
            raise EngineError(404, "page not found")
        c = self.find(parts[1])
        action = parts[2] if len(parts) > 2 else ""
        if method == "GET" and action == "json":
            return JSONResponse(self.inspect(c))
        if method == "GET" and action == "logs":
            return Response(self.logs(c, query.get("tail")))  # v1.41 sets no Content-Type
        if method == "POST" and action == "start":
            return Response(status_code=204 if self.start(c) else 304)
        if method == "POST" and action == "stop":
            return Response(status_code=204 if self.stop(c, float(query.get("t", "10"))) else 304)
        if method == "POST" and action == "rename":
            self.rename(c, query["name"])
            return Response(status_code=204)
        if method == "DELETE" and not action:
            self.remove(c, query.get("force") in ("1", "true", "True"))
            return Response(status_code=204)
        raise EngineError(404, "page not found")
