"""A Kubernetes API server stand-in on loopback, with a controller and a kubelet that run the
SGLang twin as the pods' container.

What it serves, with the real API's paths, JSON shapes and error `Status` objects:
- apps/v1 Deployments and StatefulSets, leaderworkerset.x-k8s.io/v1 LeaderWorkerSets: GET, and
  PATCH as JSON Patch (RFC 6902, with `test`) or JSON merge patch; a spec change bumps
  `metadata.generation`;
- core/v1 pods: list by label selector, delete (graceful), and `pods/{name}/log` with
  `container`, `previous` and `tailLines`.
Requests are authorised against RBAC rules (a Role's `rules`) when given: a request they do not
allow gets the API server's 403, and every request is recorded for the least-privilege test.
Every HTTP request is also recorded as it arrived (method and path, PUT and POST included, even
one answered with an error), so a test can show that a launcher wrote nothing (`writes`).

Behaviour, as the real controllers: a Deployment replaces old pods (Recreate, so that two servers
never hold one port) and reports observedGeneration, replicas, updated/ready/available replicas
and conditions; a StatefulSet (OrderedReady) and a LeaderWorkerSet replace a pod of an old
template only when it is Ready, so a crash-looping pod must be deleted to roll back ("forced
rollback"); a LeaderWorkerSet of size N has a leader and N-1 workers per group, with LWS_* env.
The kubelet runs command + args (`$(VAR)` expanded from the container's env), probes
`readinessProbe.httpGet` on 127.0.0.1, records terminations in `lastState` with the exit code
(128 + signal), counts restarts and backs off (`CrashLoopBackOff`) before restarting.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

RESOURCES = {
    ("apps", "deployments"): "Deployment",
    ("apps", "statefulsets"): "StatefulSet",
    ("leaderworkerset.x-k8s.io", "leaderworkersets"): "LeaderWorkerSet",
}
LWS = "leaderworkerset.sigs.k8s.io"


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }


@dataclass(frozen=True)
class Slot:
    name: str
    group: str
    role: str  # which template: pod, leader or worker
    env: dict[str, str]


@dataclass(frozen=True)
class Access:
    verb: str
    group: str
    resource: str  # with "/subresource" when there is one
    namespace: str
    name: str


# --------------------------------------------------------------------------- patches
def _unpointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, "Invalid", f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc: Any, parts: list[str]) -> Any:
    for p in parts:
        if isinstance(doc, list):
            doc = doc[int(p)]
        elif isinstance(doc, dict):
            doc = doc[p]
        else:
            raise KeyError(p)
    return doc


def json_patch(doc: dict[str, Any], ops: Any) -> dict[str, Any]:
    if not isinstance(ops, list):
        raise ApiError(400, "BadRequest", "a JSON Patch is a list of operations")
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = _unpointer(str(op.get("path", "")))
        kind = op.get("op")
        try:
            parent = _walk(doc, parts[:-1])
            key = parts[-1]
            if kind == "test":
                if _walk(doc, parts) != op.get("value"):
                    raise ApiError(
                        422, "Invalid", f"the server rejected our request due to an error in our "
                        f"request: testing value {op['path']} failed"
                    )  # fmt: skip
            elif kind in ("add", "replace"):
                if kind == "replace":
                    _walk(doc, parts)  # must exist
                if isinstance(parent, list):
                    if key == "-":
                        parent.append(op["value"])
                    elif kind == "add":
                        parent.insert(int(key), op["value"])
                    else:
                        parent[int(key)] = op["value"]
                else:
                    parent[key] = op["value"]
            elif kind == "remove":
                if isinstance(parent, list):
                    del parent[int(key)]
                else:
                    del parent[key]
            else:
                raise ApiError(422, "Invalid", f"unsupported JSON Patch operation {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError):
            raise ApiError(
                422, "Invalid", f"the server rejected our request: {kind} {op.get('path')}: "
                "no such path"
            ) from None  # fmt: skip
    return doc


def merge_patch(doc: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(doc) if isinstance(doc, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def validate(kind: str, obj: dict[str, Any]) -> None:
    """What the API server's validation would refuse in the fields the tests touch."""
    for t in pod_templates(kind, obj).values():
        for c in (t.get("spec") or {}).get("containers") or []:
            for key in ("command", "args"):
                value = c.get(key)
                if value is not None and not (
                    isinstance(value, list) and all(isinstance(v, str) for v in value)
                ):
                    raise ApiError(
                        422, "Invalid", f"{kind}.spec: containers[{c.get('name')}].{key}: "
                        "Invalid value: must be a list of strings"
                    )  # fmt: skip
    replicas = (obj.get("spec") or {}).get("replicas")
    if replicas is not None and (not isinstance(replicas, int) or replicas < 0):
        raise ApiError(422, "Invalid", f"{kind}.spec.replicas: Invalid value: {replicas!r}")


def pod_templates(kind: str, obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = obj.get("spec") or {}
    if kind != "LeaderWorkerSet":
        return {"pod": spec.get("template") or {}}
    lwt = spec.get("leaderWorkerTemplate") or {}
    worker = lwt.get("workerTemplate") or {}
    return {"leader": lwt.get("leaderTemplate") or worker, "worker": worker}


def template_hash(template: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


# --------------------------------------------------------------------------- pods
@dataclass
class Pod:
    name: str
    namespace: str
    owner: tuple[str, str]  # (kind, name)
    slot: str
    group: str  # the LeaderWorkerSet group (the slot itself for other kinds)
    role: str  # pod, leader or worker
    template_hash: str
    labels: dict[str, str]
    annotations: dict[str, str]
    spec: dict[str, Any]
    extra_env: dict[str, str]
    uid: str = field(default_factory=lambda: secrets.token_hex(16))
    created: str = field(default_factory=now_iso)
    deleted: str | None = None
    proc: subprocess.Popen[bytes] | None = None
    runs: list[Path] = field(default_factory=list)
    restarts: int = 0
    state: dict[str, Any] = field(
        default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}}
    )
    last_state: dict[str, Any] = field(default_factory=dict)
    ready: bool = False
    started_at: str | None = None

    @property
    def container(self) -> dict[str, Any]:
        return dict(self.spec["containers"][0])


class FakeCluster:
    def __init__(
        self,
        rules: list[dict[str, Any]] | None = None,
        restart_backoff_s: float = 10.0,
        grace_s: float = 5.0,
    ) -> None:
        self.rules = rules
        self.backoff_s = restart_backoff_s
        self.grace_s = grace_s
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (kind, ns, name)
        self.pods: dict[tuple[str, str], Pod] = {}
        self.accesses: list[Access] = []
        self.requests: list[tuple[str, str]] = []  # (method, path), every one that arrived
        self.lock = threading.RLock()
        self.logs = Path(tempfile.mkdtemp(prefix="fake-kubelet-"))
        self._stop = threading.Event()
        self._started: list[subprocess.Popen[bytes]] = []
        self.controllers_running = True
        self._controller = threading.Thread(target=self._control_loop, daemon=True)
        self._controller.start()

    def container_runs(self) -> int:
        """Server containers the kubelet has started so far, in every pod."""
        with self.lock:
            return len(self._started)

    # ----------------------------------------------------------------- setup
    def add(self, obj: dict[str, Any]) -> None:
        kind = obj["kind"]
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        meta.update(
            generation=1,
            resourceVersion="1",
            uid=secrets.token_hex(16),
            creationTimestamp=now_iso(),
        )
        # What the API server stores before a controller has looked: a StatefulSet's status
        # always carries replicas (it is not omitted when zero).
        obj.setdefault(
            "status", {"replicas": 0, "availableReplicas": 0} if kind == "StatefulSet" else {}
        )
        validate(kind, obj)
        with self.lock:
            self.objects[(kind, meta["namespace"], meta["name"])] = obj

    def pids(self) -> list[int]:
        with self.lock:
            return [
                p.proc.pid
                for p in self.pods.values()
                if p.proc is not None and p.proc.poll() is None and not p.deleted
            ]

    def pod_names(self) -> list[str]:
        with self.lock:
            return sorted(p.name for p in self.pods.values())

    def shutdown(self) -> None:
        self._stop.set()
        self._controller.join(timeout=5)
        with self.lock:
            pods = list(self.pods.values())
        for pod in pods:
            pod.deleted = pod.deleted or now_iso()
            self._kill(pod, signal.SIGKILL)
        for proc in self._started:  # whatever a bug may have lost track of: leave nothing behind
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        shutil.rmtree(self.logs, ignore_errors=True)

    def writes(self) -> list[tuple[str, str]]:
        """The requests that could change something: all but reads and access reviews."""
        return [
            (method, path)
            for method, path in self.requests
            if method not in ("GET", "HEAD")
            and path != "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
        ]

    # ----------------------------------------------------------------- authorisation
    def _allows(self, access: Access) -> bool:
        """RBAC's rule match: a rule with resourceNames covers only requests naming one."""
        if self.rules is None:
            return True
        for rule in self.rules:
            names = rule.get("resourceNames") or []
            if (
                access.group in rule.get("apiGroups", [])
                and access.resource in rule.get("resources", [])
                and access.verb in rule.get("verbs", [])
                and (not names or (access.name in names and access.verb not in ("list", "watch")))
            ):
                return True
        return False

    def _review(self, body: bytes) -> dict[str, Any]:
        """A SelfSubjectAccessReview, which every authenticated account may create
        (system:basic-user): the answer is the RBAC decision for its resourceAttributes."""
        try:
            review: dict[str, Any] = json.loads(body or b"{}")
            attrs = review["spec"]["resourceAttributes"]
        except (ValueError, KeyError, TypeError):
            raise ApiError(400, "BadRequest", "spec.resourceAttributes is required") from None
        resource = attrs.get("resource", "")
        if attrs.get("subresource"):
            resource += "/" + attrs["subresource"]
        access = Access(
            attrs.get("verb", ""),
            attrs.get("group", ""),
            resource,
            attrs.get("namespace", ""),
            attrs.get("name", ""),
        )
        allowed = self._allows(access)
        status: dict[str, Any] = {"allowed": allowed}
        if allowed:
            status["reason"] = 'RBAC: allowed by RoleBinding "kvpilot-launcher"'
        review.update(
            kind="SelfSubjectAccessReview",
            apiVersion="authorization.k8s.io/v1",
            metadata={"creationTimestamp": None},
            status=status,
        )
        return review

    def _authorise(self, access: Access) -> None:
        self.accesses.append(access)
        if self._allows(access):
            return
        group = f' in API group "{access.group}"' if access.group else ""
        resource, _, sub = access.resource.partition("/")
        what = f'resource "{resource}"' + (f' subresource "{sub}"' if sub else "")
        raise ApiError(
            403,
            "Forbidden",
            f'{resource}{"." + access.group if access.group else ""} "{access.name}" is forbidden: '
            f'User "system:serviceaccount:{access.namespace}:kvpilot" cannot {access.verb} '
            f'{what}{group} in the namespace "{access.namespace}"',
        )

    # ----------------------------------------------------------------- HTTP
    def app(self) -> Starlette:
        async def endpoint(request: Request) -> Response:
            self.requests.append((request.method, request.url.path))
            body = await request.body()
            try:
                return await run_in_threadpool(
                    self._route,
                    request.method,
                    request.url.path,
                    dict(request.query_params),
                    request.headers.get("content-type", ""),
                    body,
                )
            except ApiError as exc:
                return JSONResponse(exc.status(), status_code=exc.code)

        return Starlette(
            routes=[
                Route("/{path:path}", endpoint, methods=["GET", "PATCH", "PUT", "DELETE", "POST"])
            ]
        )

    def _route(
        self, method: str, path: str, query: dict[str, str], ctype: str, body: bytes
    ) -> Response:
        if path == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews" and method == "POST":
            return JSONResponse(self._review(body), status_code=201)
        m = re.fullmatch(r"/apis/([^/]+)/v1/namespaces/([^/]+)/([^/]+)/([^/]+)", path)
        if m:
            group, ns, resource, name = m.groups()
            kind = RESOURCES.get((group, resource))
            if kind is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            verb = {"GET": "get", "PATCH": "patch"}.get(method)
            if verb is None:
                raise ApiError(405, "MethodNotAllowed", f"{method} is not supported here")
            self._authorise(Access(verb, group, resource, ns, name))
            if verb == "get":
                return JSONResponse(self._get(kind, ns, name, resource, group))
            return JSONResponse(self._patch(kind, ns, name, resource, group, ctype, body))
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods(?:/([^/]+))?(?:/(log))?", path)
        if m:
            ns, name, sub = m.groups()
            if name is None and method == "GET":
                self._authorise(Access("list", "", "pods", ns, ""))
                return JSONResponse(self._list_pods(ns, query.get("labelSelector", "")))
            if name is not None and sub == "log" and method == "GET":
                self._authorise(Access("get", "", "pods/log", ns, name))
                return PlainTextResponse(self._log(ns, name, query))
            if name is not None and sub is None and method == "DELETE":
                self._authorise(Access("delete", "", "pods", ns, name))
                return JSONResponse(self._delete_pod(ns, name))
            if name is not None and sub is None and method == "GET":
                self._authorise(Access("get", "", "pods", ns, name))
                with self.lock:
                    pod = self._pod(ns, name)
                    return JSONResponse(self._pod_json(pod))
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _get(self, kind: str, ns: str, name: str, resource: str, group: str) -> dict[str, Any]:
        with self.lock:
            obj = self.objects.get((kind, ns, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{resource}.{group} "{name}" not found')
            return copy.deepcopy(obj)

    def _patch(
        self, kind: str, ns: str, name: str, resource: str, group: str, ctype: str, body: bytes
    ) -> dict[str, Any]:
        try:
            patch = json.loads(body)
        except ValueError:
            raise ApiError(400, "BadRequest", "the patch is not valid JSON") from None
        with self.lock:
            obj = self.objects.get((kind, ns, name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{resource}.{group} "{name}" not found')
            media = ctype.split(";", maxsplit=1)[0].strip()
            if media == "application/json-patch+json":
                new = json_patch(obj, patch)
            elif media == "application/merge-patch+json":
                new = merge_patch(obj, patch)
            else:
                raise ApiError(
                    415, "UnsupportedMediaType", f"the body of the request was in an unknown "
                    f"format - accepted media types include: application/json-patch+json, "
                    f"application/merge-patch+json (got {media!r})"
                )  # fmt: skip
            validate(kind, new)
            meta = new["metadata"]
            if new.get("spec") != obj.get("spec"):
                meta["generation"] = int(meta.get("generation", 1)) + 1
            meta["resourceVersion"] = str(int(meta.get("resourceVersion", "1")) + 1)
            new["status"] = obj.get("status", {})
            self.objects[(kind, ns, name)] = new
            return copy.deepcopy(new)

    def _list_pods(self, ns: str, selector: str) -> dict[str, Any]:
        wanted = dict(item.split("=", 1) for item in selector.split(",") if item)
        with self.lock:
            pods = [
                self._pod_json(p)
                for p in sorted(self.pods.values(), key=lambda p: p.name)
                if p.namespace == ns and all(p.labels.get(k) == v for k, v in wanted.items())
            ]
        return {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": "1"},
            "items": pods,
        }

    def _pod(self, ns: str, name: str) -> Pod:
        pod = self.pods.get((ns, name))
        if pod is None:
            raise ApiError(404, "NotFound", f'pods "{name}" not found')
        return pod

    def _delete_pod(self, ns: str, name: str) -> dict[str, Any]:
        with self.lock:
            pod = self._pod(ns, name)
            self._terminate(pod)
            return self._pod_json(pod)

    def _log(self, ns: str, name: str, query: dict[str, str]) -> str:
        with self.lock:
            pod = self._pod(ns, name)
            container = query.get("container") or pod.container["name"]
            if container != pod.container["name"]:
                raise ApiError(
                    400, "BadRequest", f"container {container} is not valid for pod {name}"
                )
            runs = list(pod.runs)
        running = pod.proc is not None
        if query.get("previous") in ("true", "True", "1"):
            # The previous container is the one before the running one, or, between restarts,
            # the one that just terminated.
            earlier = runs[:-1] if running else runs
            if not earlier:
                raise ApiError(
                    400, "BadRequest",
                    f'previous terminated container "{container}" in pod "{name}" not found',
                )  # fmt: skip
            path = earlier[-1]
        elif runs:
            path = runs[-1]
        else:
            raise ApiError(
                400, "BadRequest", f'container "{container}" in pod "{name}" is waiting to start'
            )
        lines = path.read_text(errors="replace").splitlines(keepends=True)
        if "tailLines" in query:
            lines = lines[-int(query["tailLines"]) :]
        return "".join(lines)

    # ----------------------------------------------------------------- pod JSON
    def _pod_json(self, pod: Pod) -> dict[str, Any]:
        c = pod.container
        status = {
            "name": c["name"],
            "image": c.get("image", ""),
            "imageID": f"docker.io/{c.get('image', 'unknown')}@sha256:{'0' * 64}",
            "containerID": f"containerd://{pod.uid}{pod.restarts}",
            "ready": pod.ready,
            "restartCount": pod.restarts,
            "started": "running" in pod.state,
            "state": copy.deepcopy(pod.state),
            "lastState": copy.deepcopy(pod.last_state),
        }
        ready = "True" if pod.ready else "False"
        meta: dict[str, Any] = {
            "name": pod.name,
            "namespace": pod.namespace,
            "uid": pod.uid,
            "labels": dict(pod.labels),
            "annotations": dict(pod.annotations),
            "creationTimestamp": pod.created,
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": pod.owner[0],
                    "name": pod.owner[1],
                    "uid": pod.uid,
                    "controller": True,
                }
            ],
        }
        if pod.deleted:
            meta["deletionTimestamp"] = pod.deleted
            meta["deletionGracePeriodSeconds"] = int(self.grace_s)
        return {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": meta,
            "spec": {**copy.deepcopy(pod.spec), "nodeName": "gpu-node-1"},
            "status": {
                "phase": "Running" if pod.started_at else "Pending",
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": pod.created},
                    {"type": "Initialized", "status": "True", "lastTransitionTime": pod.created},
                    {"type": "ContainersReady", "status": ready, "lastTransitionTime": pod.created},
                    {"type": "Ready", "status": ready, "lastTransitionTime": pod.created},
                ],
                "hostIP": "127.0.0.1",
                "podIP": "127.0.0.1",
                "startTime": pod.created,
                "containerStatuses": [status],
            },
        }

    # ----------------------------------------------------------------- kubelet
    def _start_container(self, pod: Pod) -> None:
        c = pod.container
        env = {e["name"]: str(e.get("value", "")) for e in c.get("env") or [] if "name" in e}
        env = {**pod.extra_env, **env}

        def expand(word: str) -> str:
            return re.sub(
                r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
                word,
            )

        argv = [expand(str(w)) for w in (c.get("command") or []) + (c.get("args") or [])]
        log = self.logs / f"{pod.name}-{pod.uid[:6]}-{len(pod.runs)}.log"
        pod.runs.append(log)
        with log.open("wb") as out:
            try:
                proc = subprocess.Popen(
                    argv,
                    cwd=c.get("workingDir") or None,
                    env={**os.environ, **env},
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as exc:
                pod.state = {
                    "waiting": {
                        "reason": "RunContainerError",
                        "message": f"exec: {exc}",
                    }
                }
                return
        self._started.append(proc)
        pod.proc = proc
        pod.started_at = pod.started_at or now_iso()
        pod.state = {"running": {"startedAt": now_iso()}}
        threading.Thread(target=self._watch, args=(pod, proc), daemon=True).start()

    def _watch(self, pod: Pod, proc: subprocess.Popen[bytes]) -> None:
        probe = (pod.container.get("readinessProbe") or {}).get("httpGet")
        started = pod.state.get("running", {}).get("startedAt", now_iso())
        while proc.poll() is None:
            ready = True
            if probe:
                url = f"http://127.0.0.1:{probe['port']}{probe.get('path', '/')}"
                try:
                    ready = httpx.get(url, timeout=1.0).status_code < 400
                except httpx.HTTPError:
                    ready = False
            with self.lock:
                pod.ready = ready and not pod.deleted
            time.sleep(0.1)
        rc = proc.returncode
        code = 128 - rc if rc < 0 else rc
        with self.lock:
            pod.ready = False
            pod.proc = None
            if pod.deleted:
                self._forget(pod)
                return
            pod.last_state = {
                "terminated": {
                    "exitCode": code,
                    "reason": "Completed" if code == 0 else "Error",
                    "startedAt": started,
                    "finishedAt": now_iso(),
                    "containerID": f"containerd://{pod.uid}{pod.restarts}",
                }
            }
            pod.restarts += 1
            delay = min(300.0, self.backoff_s * 2 ** (pod.restarts - 1))
            pod.state = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off {delay:g}s restarting failed container="
                    f"{pod.container['name']} pod={pod.name}_{pod.namespace}({pod.uid})",
                }
            }
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline and not pod.deleted and not self._stop.is_set():
            time.sleep(0.05)
        with self.lock:
            if pod.deleted or self._stop.is_set():
                self._forget(pod)
                return
            self._start_container(pod)

    def _forget(self, pod: Pod) -> None:
        """Remove a pod that is gone; a new pod may already have its name (a StatefulSet's)."""
        if self.pods.get((pod.namespace, pod.name)) is pod:
            del self.pods[(pod.namespace, pod.name)]

    def _terminate(self, pod: Pod) -> None:
        if pod.deleted:
            return
        pod.deleted = now_iso()
        pod.ready = False
        if pod.proc is None:
            self._forget(pod)
            return
        self._kill(pod, signal.SIGTERM)
        proc = pod.proc

        def escalate() -> None:
            time.sleep(self.grace_s)
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)

        threading.Thread(target=escalate, daemon=True).start()

    def _kill(self, pod: Pod, sig: int) -> None:
        proc = pod.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            if sig == signal.SIGKILL:
                proc.wait(timeout=10)

    # ----------------------------------------------------------------- controllers
    def _control_loop(self) -> None:
        while not self._stop.is_set():
            if not self.controllers_running:  # as when kube-controller-manager is down
                time.sleep(0.05)
                continue
            with self.lock:
                for (kind, ns, name), obj in list(self.objects.items()):
                    self._reconcile(kind, ns, name, obj)
            time.sleep(0.05)

    def _owned(self, kind: str, ns: str, name: str) -> list[Pod]:
        return [p for p in self.pods.values() if p.owner == (kind, name) and p.namespace == ns]

    def _slots(self, kind: str, name: str, obj: dict[str, Any]) -> list[Slot]:
        """Every pod the workload wants."""
        replicas = int((obj.get("spec") or {}).get("replicas", 1))
        if kind == "Deployment":
            return [Slot(str(i), str(i), "pod", {}) for i in range(replicas)]
        if kind == "StatefulSet":
            return [Slot(f"{name}-{i}", f"{name}-{i}", "pod", {}) for i in range(replicas)]
        size = int(((obj.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("size") or 1)
        out = []
        for g in range(replicas):
            for w in range(size):
                env = {
                    "LWS_LEADER_ADDRESS": "127.0.0.1",
                    "LWS_GROUP_SIZE": str(size),
                    "LWS_WORKER_INDEX": str(w),
                    "LWS_NAME": name,
                }
                slot = f"{name}-{g}" if w == 0 else f"{name}-{g}-{w}"
                out.append(Slot(slot, f"{name}-{g}", "leader" if w == 0 else "worker", env))
        return out

    def _reconcile(self, kind: str, ns: str, name: str, obj: dict[str, Any]) -> None:
        templates = pod_templates(kind, obj)
        hashes = {role: template_hash(t) for role, t in templates.items()}
        slots = self._slots(kind, name, obj)
        owned = self._owned(kind, ns, name)
        live = [p for p in owned if not p.deleted]
        wanted = {slot.name for slot in slots}
        for pod in live:  # scale down
            if pod.slot not in wanted:
                self._terminate(pod)
        if kind == "Deployment":
            old = [p for p in live if p.template_hash != hashes["pod"]]
            for pod in old:
                self._terminate(pod)
            if not any(p.deleted for p in self._owned(kind, ns, name)):
                have = {p.slot for p in self._owned(kind, ns, name)}
                for slot in slots:
                    if slot.name not in have:
                        self._create_pod(kind, ns, name, slot, templates, hashes)
        else:
            for slot in slots:
                pods = [p for p in self._owned(kind, ns, name) if p.slot == slot.name]
                current = [p for p in pods if not p.deleted]
                stale = current and current[0].template_hash != hashes[slot.role]
                if stale and current[0].ready:  # OrderedReady: a broken pod is left alone
                    self._terminate(current[0])
                if not pods:
                    self._create_pod(kind, ns, name, slot, templates, hashes)
        self._status(kind, ns, name, obj, hashes, slots)

    def _create_pod(
        self,
        kind: str,
        ns: str,
        name: str,
        slot: Slot,
        templates: dict[str, dict[str, Any]],
        hashes: dict[str, str],
    ) -> None:
        template, thash, env = templates[slot.role], hashes[slot.role], slot.env
        meta = template.get("metadata") or {}
        labels = dict(meta.get("labels") or {})
        if kind == "Deployment":
            labels["pod-template-hash"] = thash
            pod_name = f"{name}-{thash}-{secrets.token_hex(3)[:5]}"
        elif kind == "StatefulSet":
            labels["controller-revision-hash"] = f"{name}-{thash}"
            labels["statefulset.kubernetes.io/pod-name"] = slot.name
            pod_name = slot.name
        else:
            labels[f"{LWS}/name"] = name
            labels[f"{LWS}/template-revision-hash"] = thash
            labels[f"{LWS}/worker-index"] = env["LWS_WORKER_INDEX"]
            labels[f"{LWS}/group-key"] = slot.group
            pod_name = slot.name
        pod = Pod(
            name=pod_name,
            namespace=ns,
            owner=(kind, name),
            slot=slot.name,
            group=slot.group,
            role=slot.role,
            template_hash=thash,
            labels=labels,
            annotations=dict(meta.get("annotations") or {}),
            spec=copy.deepcopy(template.get("spec") or {}),
            extra_env=env,
        )
        self.pods[(ns, pod_name)] = pod
        self._start_container(pod)

    def _status(
        self,
        kind: str,
        ns: str,
        name: str,
        obj: dict[str, Any],
        hashes: dict[str, str],
        slots: list[Slot],
    ) -> None:
        live = [p for p in self._owned(kind, ns, name) if not p.deleted]
        want = int((obj.get("spec") or {}).get("replicas", 1))
        updated = [p for p in live if p.template_hash in hashes.values()]
        ready = [p for p in live if p.ready]
        generation = obj["metadata"]["generation"]
        if kind == "Deployment":
            obj["status"] = {
                "observedGeneration": generation,
                "replicas": len(live),
                "updatedReplicas": len(updated),
                "readyReplicas": len(ready),
                "availableReplicas": len(ready),
                "unavailableReplicas": max(0, want - len(ready)),
                "conditions": [
                    {
                        "type": "Available",
                        "status": "True" if len(ready) >= want else "False",
                        "reason": "MinimumReplicasAvailable"
                        if len(ready) >= want
                        else "MinimumReplicasUnavailable",
                        "lastUpdateTime": now_iso(),
                        "lastTransitionTime": now_iso(),
                    },
                    {
                        "type": "Progressing",
                        "status": "True",
                        "reason": "NewReplicaSetAvailable"
                        if len(updated) == len(ready) == want
                        else "ReplicaSetUpdated",
                        "lastUpdateTime": now_iso(),
                        "lastTransitionTime": now_iso(),
                    },
                ],
            }
        elif kind == "StatefulSet":
            revision = f"{name}-{hashes['pod']}"
            old = [p for p in live if p.template_hash != hashes["pod"]]
            current_revision = f"{name}-{old[0].template_hash}" if old else revision
            obj["status"] = {
                "observedGeneration": generation,
                "replicas": len(live),
                "readyReplicas": len(ready),
                "availableReplicas": len(ready),
                "currentReplicas": len(live) - len(updated) if old else len(live),
                "updatedReplicas": len(updated),
                "currentRevision": current_revision,
                "updateRevision": revision,
                "collisionCount": 0,
            }
        else:
            groups: dict[str, list[Pod]] = {}
            for pod in live:
                groups.setdefault(pod.group, []).append(pod)
            size = len(slots) // want if want else 1
            full = [g for g in groups.values() if len(g) == size]
            ready_groups = [g for g in full if all(p.ready for p in g)]
            updated_groups = [g for g in full if all(p.template_hash == hashes[p.role] for p in g)]
            obj["status"] = {
                "replicas": len(groups),
                "readyReplicas": len(ready_groups),
                "updatedReplicas": len(updated_groups),
                "hpaPodSelector": f"{LWS}/name={name},{LWS}/worker-index=0",
                "conditions": [
                    {
                        "type": "Available",
                        "status": "True" if len(ready_groups) >= want else "False",
                        "reason": "AllGroupsReady"
                        if len(ready_groups) >= want
                        else "GroupsNotReady",
                        "message": f"{len(ready_groups)} of {want} groups ready",
                        "lastTransitionTime": now_iso(),
                    }
                ],
            }
