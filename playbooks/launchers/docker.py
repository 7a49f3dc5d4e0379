"""The `docker` launcher: the server runs in a container (an SGLang or a vLLM image).

A container's command cannot be changed in place, so kvpilot recreates it through the Docker
Engine API on its Unix socket, the way `docker compose` does: it inspects the running container,
creates a new one from the same configuration (the same image by ID, mounts, devices and GPU
requests, environment, network, ports, labels, restart policy) with the new SGLang arguments, and
only then swaps them:

    create NAME-kvpilot-next -> stop NAME -> rename NAME to NAME-kvpilot-previous
    -> rename NAME-kvpilot-next to NAME -> start NAME -> ready -> remove NAME-kvpilot-previous

If kvpilot dies anywhere in between, the system still says what is true: the container called
NAME, or, between the two renames, NAME-kvpilot-previous, which `current_args`, `state` and the
next `apply` use. Readiness is the engine's readiness path; failure is the container's state
(exited, restarting, OOM-killed) explained from its exit code and log.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, cast

import httpx

from playbooks.clock import Clock, WallClock
from playbooks.engines import default_engine
from playbooks.engines.base import Engine
from playbooks.engines.exits import ExitCause, Failure
from playbooks.launchers.base import Finding, LaunchError, ServerIdentity, ServerState
from playbooks.launchers.common import (
    StartThenWait,
    flag_index,
    health_ok,
    poll_until,
    rfc3339_epoch,
    split_command,
    still_starting,
)

API_VERSION = "v1.41"  # Docker Engine 20.10 and later
NEXT_SUFFIX = "-kvpilot-next"
PREVIOUS_SUFFIX = "-kvpilot-previous"
# Fields of an inspected container's Config that `POST /containers/create` takes back.
CONFIG_FIELDS = (
    "Hostname",
    "Domainname",
    "User",
    "AttachStdin",
    "AttachStdout",
    "AttachStderr",
    "ExposedPorts",
    "Tty",
    "OpenStdin",
    "StdinOnce",
    "Env",
    "Cmd",
    "Healthcheck",
    "ArgsEscaped",
    "Volumes",
    "WorkingDir",
    "Entrypoint",
    "NetworkDisabled",
    "MacAddress",
    "OnBuild",
    "Labels",
    "StopSignal",
    "StopTimeout",
    "Shell",
)
DEFAULT_NETWORK_MODES = ("default", "bridge", "host", "none")


@dataclass(frozen=True)
class DockerSpec:
    container: str  # the container's name
    url: str  # the server's HTTP address, for readiness
    socket: str = "/var/run/docker.sock"
    ready_timeout_s: float = 1800.0  # on the clock
    stop_timeout_s: float = 60.0  # wall seconds SGLang gets to exit before SIGKILL
    request_timeout_s: float = 30.0
    engine: Engine = field(default_factory=default_engine)  # whose signatures to read


class DockerError(LaunchError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class DockerEngine:
    """The few Docker Engine API calls the launcher needs, over the Unix socket."""

    def __init__(self, socket: str, timeout_s: float = 30.0) -> None:
        self.socket = socket
        self.timeout_s = timeout_s

    def _client(self) -> httpx.Client:
        # Not `playbooks.http.http_client`: that one is for read-only HTTP sources and retries;
        # this client speaks to a Unix socket and recreates containers, which is never retried.
        # One connection a call: a launcher is built per step and never closed, and a Unix
        # socket costs nothing to open, so no connection outlives its call.
        return httpx.Client(
            transport=httpx.HTTPTransport(uds=self.socket),
            base_url=f"http://docker/{API_VERSION}",
            timeout=self.timeout_s,
        )

    def call(
        self,
        method: str,
        path: str,
        *,
        ok: tuple[int, ...] = (200,),
        params: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> httpx.Response:
        try:
            with self._client() as http:
                response = http.request(
                    method, path, params=params, json=body, timeout=timeout_s or self.timeout_s
                )
        except httpx.TransportError as exc:
            raise LaunchError(
                f"cannot reach the Docker Engine at unix://{self.socket}: {exc} (is Docker "
                "running, and may kvpilot's user open the socket, e.g. as a member of the "
                "docker group?)"
            ) from None
        if response.status_code not in ok:
            try:
                message = str(response.json().get("message", response.text))
            except ValueError:
                message = response.text
            raise DockerError(
                response.status_code, f"Docker Engine: {method} {path}: {message.strip()}"
            )
        return response

    def inspect(self, name: str) -> dict[str, Any] | None:
        response = self.call("GET", f"/containers/{name}/json", ok=(200, 404))
        if response.status_code == 404:
            return None
        return cast(dict[str, Any], response.json())

    def create(self, name: str, body: dict[str, Any]) -> str:
        response = self.call(
            "POST", "/containers/create", ok=(201,), params={"name": name}, body=body
        )
        return str(response.json()["Id"])

    def start(self, ident: str) -> None:
        self.call("POST", f"/containers/{ident}/start", ok=(204, 304))

    def stop(self, ident: str, timeout_s: float) -> None:
        self.call(
            "POST",
            f"/containers/{ident}/stop",
            ok=(204, 304),
            params={"t": str(int(timeout_s))},
            timeout_s=timeout_s + self.timeout_s,
        )

    def connect(self, network: str, ident: str, settings: dict[str, Any]) -> None:
        self.call(
            "POST",
            f"/networks/{network}/connect",
            ok=(200,),
            body={"Container": ident, "EndpointConfig": settings},
        )

    def rename(self, ident: str, name: str) -> None:
        self.call("POST", f"/containers/{ident}/rename", ok=(204,), params={"name": name})

    def remove(self, ident: str) -> None:
        self.call("DELETE", f"/containers/{ident}", ok=(204, 404), params={"force": "true"})

    def logs(self, ident: str, tty: bool, lines: int = 300) -> str:
        response = self.call(
            "GET",
            f"/containers/{ident}/logs",
            ok=(200, 404),
            params={"stdout": "true", "stderr": "true", "tail": str(lines)},
        )
        if response.status_code == 404:
            return ""
        data = response.content
        return (data if tty else demultiplex(data)).decode(errors="replace")


def demultiplex(data: bytes) -> bytes:
    """Undo the Engine's stream framing: per frame, [stream, 0, 0, 0, size (u32, big-endian)]."""
    out = bytearray()
    i = 0
    while i + 8 <= len(data):
        size = int.from_bytes(data[i + 4 : i + 8], "big")
        out += data[i + 8 : i + 8 + size]
        i += 8 + size
    return bytes(out)


def full_command(info: dict[str, Any]) -> tuple[list[str], list[str]]:
    config = info.get("Config") or {}
    return list(config.get("Entrypoint") or []), list(config.get("Cmd") or [])


def recreate_body(info: dict[str, Any], args: list[str]) -> dict[str, Any]:
    """The create request for a copy of an inspected container running SGLang with `args`."""
    config = info.get("Config") or {}
    body: dict[str, Any] = {k: config[k] for k in CONFIG_FIELDS if k in config}
    if body.get("Hostname") == str(info.get("Id", ""))[:12]:
        del body["Hostname"]  # Docker's default hostname is the container's own short ID
    body["Image"] = info["Image"]  # the image ID: the same bits even if the tag has moved
    entrypoint, cmd = full_command(info)
    at = flag_index(entrypoint + cmd)
    if at is None:
        raise LaunchError(
            f"container {str(info.get('Name', '')).lstrip('/')} runs "
            f"{' '.join(entrypoint + cmd)!r}, which has no SGLang --flags for kvpilot to change"
        )
    if at >= len(entrypoint):
        body["Cmd"] = cmd[: at - len(entrypoint)] + args
    else:
        body["Entrypoint"] = entrypoint[:at] + args
        body["Cmd"] = []
    body["HostConfig"] = info.get("HostConfig") or {}
    mode = str(body["HostConfig"].get("NetworkMode") or "default")
    networks = (info.get("NetworkSettings") or {}).get("Networks") or {}
    if mode not in DEFAULT_NETWORK_MODES and not mode.startswith("container:") and mode in networks:
        body["NetworkingConfig"] = {"EndpointsConfig": {mode: endpoint_settings(info, mode)}}
    return body


def other_networks(info: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The networks an inspected container is on besides the one its create request names
    (its network mode's; `bridge` for the default), each with its endpoint settings: the API
    version kvpilot speaks (1.41) creates a container on one network, so the rest are
    connected before it starts (`docker network connect`)."""
    mode = str((info.get("HostConfig") or {}).get("NetworkMode") or "default")
    if mode in ("host", "none") or mode.startswith("container:"):
        return {}  # a shared namespace: no other network can be joined
    main = "bridge" if mode in ("default", "bridge") else mode
    networks = (info.get("NetworkSettings") or {}).get("Networks") or {}
    return {name: endpoint_settings(info, name) for name in sorted(networks) if name != main}


def endpoint_settings(info: dict[str, Any], network: str) -> dict[str, Any]:
    """What a copy needs of the container's endpoint on `network`: its fixed addresses, links
    and aliases (less the short ID Docker adds to every container by itself)."""
    endpoint = ((info.get("NetworkSettings") or {}).get("Networks") or {}).get(network) or {}
    short_id = str(info.get("Id", ""))[:12]
    settings = {
        "IPAMConfig": endpoint.get("IPAMConfig"),
        "Links": endpoint.get("Links"),
        "Aliases": [a for a in endpoint.get("Aliases") or [] if a != short_id],
    }
    return {k: v for k, v in settings.items() if v}


def exit_cause(st: dict[str, Any], log: str, engine: Engine) -> ExitCause:
    """Why the container stopped: Docker's OOMKilled first, then the engine's reading of its
    exit code and log, with Docker's own error appended."""
    if st.get("OOMKilled"):
        return ExitCause(
            Failure.out_of_memory,
            "killed by the kernel's OOM killer (the container's memory limit or host RAM)",
        )
    code = st.get("ExitCode")
    cause = engine.exit_cause(code if isinstance(code, int) else None, log)
    error = st.get("Error")
    return replace(cause, reason=f"{cause.reason} ({error})") if error else cause


def container_identity(info: dict[str, Any]) -> ServerIdentity | None:
    """A running container: its Id, and State.StartedAt, which its restart policy's restarts
    (or `docker restart`) renew while the Id stays (Engine API, ContainerInspect: State)."""
    st = info.get("State") or {}
    if not st.get("Running") or st.get("Restarting"):
        return None
    ident, started = str(info.get("Id", "")), str(st.get("StartedAt", ""))
    name = str(info.get("Name", "")).lstrip("/")
    return ServerIdentity(
        f"{ident}@{started}",
        rfc3339_epoch(started),
        f"container {name} {ident[:12]}, pid {st.get('Pid')}",
    )


class DockerLauncher(StartThenWait[DockerSpec]):
    kind = "docker"

    def __init__(
        self, spec: DockerSpec, clock: Clock | None = None, engine: DockerEngine | None = None
    ) -> None:
        self.spec = spec
        self.clock = clock or WallClock()
        self.engine = engine or DockerEngine(spec.socket, spec.request_timeout_s)
        self._started: str | None = None

    @property
    def name(self) -> str:
        return self.spec.container

    def lookup(self) -> dict[str, Any] | None:
        """The container that holds the truth: NAME, or the previous one mid-swap."""
        for name in (self.name, self.name + PREVIOUS_SUFFIX):
            info = self.engine.inspect(name)
            if info is not None:
                return info
        return None

    def find(self) -> dict[str, Any]:
        info = self.lookup()
        if info is None:
            raise LaunchError(self._missing())
        return info

    def _missing(self) -> str:
        return (
            f"no container named {self.name!r} on the Docker Engine at unix://{self.spec.socket} "
            "(kvpilot recreates an existing container: start it once with `docker run --name "
            f"{self.name} ...`)"
        )

    def permissions(self) -> list[Finding]:
        """The Engine answers on its socket for this user, and the container exists."""
        try:
            # the Engine answers /_ping with its API version in a header (Engine API docs)
            api = self.engine.call("GET", "/_ping").headers.get("api-version", "?")
            info = self.lookup()
        except LaunchError as exc:
            return [Finding(False, exc.reason, "")]
        found = [Finding(True, f"Docker Engine (API {api}) at unix://{self.spec.socket}")]
        if info is None:
            fix = f"create it once: docker run --name {self.name} ... (kvpilot recreates it)"
            found.append(Finding(False, self._missing().split(" (")[0], fix))
        else:
            image = info.get("Config", {}).get("Image", "?")
            status = info.get("State", {}).get("Status", "?")
            found.append(Finding(True, f"container {self.name}: {image}, {status}"))
        return found

    # ----------------------------------------------------------------- interface
    def current_args(self) -> list[str]:
        entrypoint, cmd = full_command(self.find())
        return split_command(entrypoint + cmd)[1]

    def state(self) -> ServerState:
        info = self.lookup()
        if info is None:
            return ServerState(False, False, None, None, self._missing())
        st = info.get("State") or {}
        pid = st.get("Pid") or None
        if st.get("Running") and not st.get("Restarting") and not st.get("Paused"):
            ready = health_ok(self.spec.url, self.spec.engine)
            return ServerState(True, ready, pid, None, "" if ready else "starting or not ready")
        if st.get("Status") == "created":
            return ServerState(False, False, None, None, "created but not started")
        code = st.get("ExitCode")
        log = self._log(info)
        cause = exit_cause(st, log, self.spec.engine)
        reason = cause.reason
        if st.get("Restarting"):
            reason += " (Docker restarts it, by its restart policy)"
        return ServerState(
            False, False, pid, code if isinstance(code, int) else None, reason, cause
        )

    def start(self, args: list[str]) -> None:
        current = self.find()
        if (current.get("HostConfig") or {}).get("AutoRemove"):
            raise LaunchError(
                f"container {self.name} was started with --rm, so stopping it deletes it and "
                "nothing would be left to roll back to: start it without --rm"
            )
        body = recreate_body(current, args)
        self.engine.remove(self.name + NEXT_SUFFIX)  # a leftover of an interrupted apply
        new_id = self.engine.create(self.name + NEXT_SUFFIX, body)
        for network, settings in other_networks(current).items():
            self.engine.connect(network, new_id, settings)
        if (current.get("State") or {}).get("Running"):
            self.engine.stop(current["Id"], self.spec.stop_timeout_s)
        if current.get("Name") == "/" + self.name:
            self.engine.remove(self.name + PREVIOUS_SUFFIX)
            self.engine.rename(current["Id"], self.name + PREVIOUS_SUFFIX)
        self.engine.rename(new_id, self.name)
        self.engine.start(new_id)
        self._started = new_id

    def _starting(self) -> str:
        """The container being started: the last issued, or (a fresh launcher) the current."""
        if self._started is None:
            self._started = self.find()["Id"]
        return self._started

    def poll_ready(self) -> bool:
        """One inspect: exited or restarting is a failure, created (never started) is started;
        ready removes the previous one."""
        ident = self._starting()
        info = self.engine.inspect(ident)
        if info is None:
            raise LaunchError(f"container {self.name} was removed while it started")
        st = info.get("State") or {}
        if st.get("Status") == "created":
            # created and never started: a bot killed between the swap's last rename and its
            # start. Nothing else will start it, so waiting would only run out the deadline.
            self.engine.start(ident)
            return False
        if st.get("Status") in ("exited", "dead") or st.get("Restarting"):
            log = self._log(info)
            if st.get("Restarting"):
                self.engine.stop(ident, self.spec.stop_timeout_s)
            cause = exit_cause(st, log, self.spec.engine)
            raise LaunchError(
                f"container {self.name} exited before it was ready: {cause.reason}",
                log,
                cause=cause,
            )
        ready = bool(st.get("Running")) and health_ok(self.spec.url, self.spec.engine)
        if ready:
            self.engine.remove(self.name + PREVIOUS_SUFFIX)
        return ready

    def give_up(self) -> str:
        """Stopped, so that a start that never got ready frees the GPUs; its log, read before."""
        ident = self._starting()
        info = self.engine.inspect(ident)
        log = self._log(info) if info else ""
        self.engine.stop(ident, self.spec.stop_timeout_s)
        return log

    def wait_ready(self) -> None:
        if not poll_until(self.clock, self.spec.ready_timeout_s, self.poll_ready):
            raise still_starting(
                f"container {self.name}",
                self.spec.ready_timeout_s,
                self.give_up(),
                "it was stopped",
            )

    def identity(self) -> ServerIdentity | None:
        info = self.lookup()
        return None if info is None else container_identity(info)

    def stop(self) -> None:
        info = self.find()
        self.engine.stop(info["Id"], self.spec.stop_timeout_s)

    def _log(self, info: dict[str, Any]) -> str:
        tty = bool((info.get("Config") or {}).get("Tty"))
        return self.engine.logs(info["Id"], tty)
