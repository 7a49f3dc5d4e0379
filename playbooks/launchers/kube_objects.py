"""Kubernetes workload objects as the kubernetes launcher reads and patches them (pure).

Objects are the API's JSON (camelCase dictionaries). A workload holds one or two pod templates:
a Deployment or StatefulSet has `spec.template`; a LeaderWorkerSet has
`spec.leaderWorkerTemplate.workerTemplate` and, optionally, a `leaderTemplate`, whose container
runs the HTTP server (it is the primary template; without one the worker template is).

Changes are JSON Patches (RFC 6902) with a `test` of the value being replaced, so a concurrent
edit by someone else makes the patch fail instead of being overwritten, and the same patch works
for built-in kinds and for the LeaderWorkerSet custom resource.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from playbooks.engines import exits
from playbooks.engines.base import Engine
from playbooks.launchers.base import LaunchError, ServerIdentity
from playbooks.launchers.common import flag_index, rfc3339_epoch, split_command

WORKLOADS = ("Deployment", "StatefulSet", "LeaderWorkerSet")
LWS_GROUP = "leaderworkerset.x-k8s.io"
LWS_VERSION = "v1"
LWS_PLURAL = "leaderworkersets"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
# A pod-template annotation that makes every apply a new rollout (as `kubectl rollout restart`
# does), and tells the pods of this apply from older ones.
STAMP = "kvpilot.io/restarted-at"
REPLICAS_BEFORE_STOP = "kvpilot.io/replicas-before-stop"
# Container waiting reasons that mean it will not come up by itself.
STUCK_WAITING = {
    "CrashLoopBackOff",
    "RunContainerError",
    "CreateContainerError",
    "CreateContainerConfigError",
    "InvalidImageName",
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
}

Obj = dict[str, Any]
Op = dict[str, Any]


@dataclass(frozen=True)
class Template:
    pointer: str  # JSON pointer of the pod template in the workload
    body: Obj
    primary: bool  # its container serves HTTP and holds the arguments kvpilot reports
    container: str  # the SGLang container's name in it


@dataclass(frozen=True)
class Failure:
    exit_code: int | None
    reason: str  # Kubernetes' word: Error, OOMKilled, CrashLoopBackOff, ErrImagePull, ...
    message: str
    previous: bool  # the log to read is the previous (terminated) container's

    def cause(self, log: str, engine: Engine) -> exits.ExitCause:
        if self.reason == "OOMKilled":
            return exits.ExitCause(
                exits.Failure.out_of_memory,
                "killed by the kernel's OOM killer (the pod's memory limit or node RAM)",
            )
        if self.exit_code is None:  # waiting (an image, a crash loop): Kubernetes' word alone
            reason = f"{self.reason}: {self.message}".rstrip(": ")
            return exits.ExitCause(exits.Failure.unknown, reason)
        return engine.exit_cause(self.exit_code, log)


def escape(key: str) -> str:
    """A JSON-pointer segment (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def templates(
    kind: str, obj: Obj, container: str | None, worker_container: str | None
) -> list[Template]:
    spec = obj.get("spec") or {}
    if kind in ("Deployment", "StatefulSet"):
        body = spec.get("template") or {}
        return [Template("/spec/template", body, True, _container_name(body, container, kind))]
    lwt = spec.get("leaderWorkerTemplate") or {}
    worker = lwt.get("workerTemplate") or {}
    base = "/spec/leaderWorkerTemplate"
    leader = lwt.get("leaderTemplate")
    if not leader:
        name = _container_name(worker, container, "LeaderWorkerSet workerTemplate")
        return [Template(f"{base}/workerTemplate", worker, True, name)]
    return [
        Template(
            f"{base}/leaderTemplate",
            leader,
            True,
            _container_name(leader, container, "LeaderWorkerSet leaderTemplate"),
        ),
        Template(
            f"{base}/workerTemplate",
            worker,
            False,
            _container_name(
                worker, worker_container or container, "LeaderWorkerSet workerTemplate"
            ),
        ),
    ]


def _containers(template: Obj) -> list[Obj]:
    return list((template.get("spec") or {}).get("containers") or [])


def _container_name(template: Obj, wanted: str | None, where: str) -> str:
    names = [str(c.get("name")) for c in _containers(template)]
    if wanted is not None:
        if wanted not in names:
            raise LaunchError(
                f"{where} has no container named {wanted!r} (it has: {', '.join(names) or 'none'})"
            )
        return wanted
    if len(names) != 1:
        raise LaunchError(
            f"{where} has {len(names)} containers ({', '.join(names)}): set `container` to the "
            "one that runs SGLang"
        )
    return names[0]


def container_of(template: Obj, name: str) -> tuple[int, Obj]:
    for i, c in enumerate(_containers(template)):
        if c.get("name") == name:
            return i, c
    raise LaunchError(f"no container named {name!r}")


def command_of(container: Obj) -> list[str]:
    return [str(t) for t in (container.get("command") or []) + (container.get("args") or [])]


def server_args(t: Template) -> list[str]:
    return split_command(command_of(container_of(t.body, t.container)[1]))[1]


def command_ops(t: Template, args: list[str]) -> list[Op]:
    """Replace the SGLang arguments of the template's container, keeping its executable part."""
    index, c = container_of(t.body, t.container)
    base = f"{t.pointer}/spec/containers/{index}"
    command = [str(x) for x in c.get("command") or []]
    current = [str(x) for x in c.get("args") or []]
    at = flag_index(command + current)
    if at is None:
        raise LaunchError(
            f"container {t.container!r} runs {' '.join(command + current)!r}, which has no "
            "SGLang --flags for kvpilot to change"
        )
    if at >= len(command):
        return [
            {"op": "test", "path": f"{base}/args", "value": c.get("args")},
            {"op": "replace", "path": f"{base}/args", "value": current[: at - len(command)] + args},
        ]
    ops: list[Op] = [
        {"op": "test", "path": f"{base}/command", "value": c.get("command")},
        {"op": "replace", "path": f"{base}/command", "value": command[:at] + args},
    ]
    if "args" in c:
        ops += [
            {"op": "test", "path": f"{base}/args", "value": c.get("args")},
            {"op": "remove", "path": f"{base}/args"},
        ]
    return ops


def args_ops(ts: list[Template], args: list[str]) -> list[Op]:
    """Give every template its arguments: `args` to the primary one, and the same flag changes
    to a LeaderWorkerSet's workers (`carry_changes`), so that the group keeps agreeing."""
    old = server_args(ts[0])
    ops: list[Op] = []
    for t in ts:
        ops += command_ops(t, args if t.primary else carry_changes(old, args, server_args(t)))
    return ops


def annotation_ops(pointer: str, obj: Obj, key: str, value: str) -> list[Op]:
    """Set one annotation of the metadata at `pointer` (the workload's or a template's)."""
    meta = obj.get("metadata")
    if meta is None:
        return [
            {"op": "add", "path": f"{pointer}/metadata", "value": {"annotations": {key: value}}}
        ]
    if meta.get("annotations") is None:
        return [{"op": "add", "path": f"{pointer}/metadata/annotations", "value": {key: value}}]
    return [{"op": "add", "path": f"{pointer}/metadata/annotations/{escape(key)}", "value": value}]


def annotation(obj: Obj, key: str) -> str | None:
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(key)
    return None if value is None else str(value)


def flag_groups(args: list[str]) -> list[tuple[str, list[str]]]:
    """Each `--flag` with the values after it (or `--flag=value`), in order."""
    groups: list[tuple[str, list[str]]] = []
    for tok in args:
        if tok.startswith("--"):
            groups.append((tok.split("=", 1)[0], [tok]))
        elif groups:
            groups[-1][1].append(tok)
        else:
            groups.append(("", [tok]))
    return groups


def carry_changes(old: list[str], new: list[str], other: list[str]) -> list[str]:
    """Make in `other` the flag changes that turn `old` into `new`.

    A LeaderWorkerSet's workers repeat the leader's SGLang flags, with a few of their own (a node
    rank, say); kvpilot changes the same flags in both and leaves the workers' own alone.
    """
    if other == old:
        return list(new)
    before = dict(flag_groups(old))
    after = dict(flag_groups(new))
    changed = {f for f in before.keys() | after.keys() if before.get(f) != after.get(f)}
    out = [tok for flag, toks in flag_groups(other) if flag not in changed for tok in toks]
    out += [tok for flag, toks in flag_groups(new) if flag in changed for tok in toks]
    return out


def replicas(obj: Obj) -> int:
    value = (obj.get("spec") or {}).get("replicas")
    return 1 if value is None else int(value)


def expected_pods(kind: str, obj: Obj) -> int:
    if kind == "LeaderWorkerSet":
        size = ((obj.get("spec") or {}).get("leaderWorkerTemplate") or {}).get("size") or 1
        return replicas(obj) * int(size)
    return replicas(obj)


def label_selector(kind: str, obj: Obj) -> str:
    if kind == "LeaderWorkerSet":
        return f"{LWS_NAME_LABEL}={obj['metadata']['name']}"
    labels = ((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    if not labels:
        raise LaunchError(
            f"{kind} {obj['metadata']['name']} selects its pods without matchLabels; kvpilot "
            "needs matchLabels to find them"
        )
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def rollout_complete(kind: str, obj: Obj) -> bool:
    """The controller has acted on the newest spec and every replica is updated and ready."""
    status = obj.get("status") or {}
    meta = obj.get("metadata") or {}
    want = replicas(obj)
    if kind != "LeaderWorkerSet" and int(status.get("observedGeneration") or 0) < int(
        meta.get("generation") or 0
    ):
        return False
    fields = ["replicas", "updatedReplicas", "readyReplicas"]
    if kind == "Deployment":
        fields.append("availableReplicas")
    if kind == "StatefulSet" and status.get("currentRevision") != status.get("updateRevision"):
        return False
    return all(int(status.get(f) or 0) == want for f in fields)


def stalled(kind: str, obj: Obj) -> str | None:
    """A Deployment past its progress deadline says so in a condition."""
    if kind != "Deployment":
        return None
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Progressing" and cond.get("status") == "False":
            return f"{cond.get('reason')}: {cond.get('message')}"
    return None


def deleting(pod: Obj) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def pod_name(pod: Obj) -> str:
    return str((pod.get("metadata") or {}).get("name"))


def pod_ready(pod: Obj) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def template_of(pod: Obj, ts: list[Template]) -> Template | None:
    """The current template this pod was made from, if any (same stamp, same command line)."""
    for t in ts:
        if annotation(pod, STAMP) != annotation(t.body, STAMP):
            continue
        try:
            _, theirs = container_of(pod, t.container)  # a pod has a template's shape
        except LaunchError:
            continue
        if command_of(theirs) == command_of(container_of(t.body, t.container)[1]):
            return t
    return None


def container_status(pod: Obj, name: str) -> Obj | None:
    for st in (pod.get("status") or {}).get("containerStatuses") or []:
        if st.get("name") == name:
            return dict(st)
    return None


def container_running(pod: Obj, name: str) -> bool:
    st = container_status(pod, name)
    return st is not None and "running" in (st.get("state") or {})


def pods_identity(current: list[tuple[Obj, Template]], want: int) -> ServerIdentity | None:
    """The server made of the current template's pods, when all `want` run it.

    A pod that is replaced gets a new `metadata.uid`; a container the kubelet restarts in place
    keeps the uid but counts up `status.containerStatuses[].restartCount`, so both are in the
    instance. The start is the earliest `state.running.startedAt` (the pod's `status.startTime`
    without one): the whole server is up only from the last of them, but the first says when
    this server began.
    """
    parts, starts = [], []
    for pod, t in current:
        st = container_status(pod, t.container) or {}
        running = (st.get("state") or {}).get("running")
        if running is None:
            continue
        meta = pod.get("metadata") or {}
        parts.append(f"{meta.get('uid') or meta.get('name')}#{int(st.get('restartCount') or 0)}")
        started = rfc3339_epoch(running.get("startedAt"))
        if started is None:
            started = rfc3339_epoch((pod.get("status") or {}).get("startTime"))
        if started is not None:
            starts.append(started)
    if not parts or len(parts) < want:
        return None
    names = ", ".join(sorted(pod_name(p) for p, _ in current))
    return ServerIdentity(",".join(sorted(parts)), min(starts, default=None), f"pods {names}")


def failure(pod: Obj, name: str, strict: bool) -> Failure | None:
    """Why the container is down, if it is; `strict` also counts a crash it came back from."""
    st = container_status(pod, name)
    status = pod.get("status") or {}
    if st is None:
        if status.get("phase") == "Failed":
            return Failure(
                None, str(status.get("reason") or "Failed"), str(status.get("message") or ""), False
            )
        return None
    state = st.get("state") or {}
    last = (st.get("lastState") or {}).get("terminated")
    if state.get("terminated"):
        return _terminated(state["terminated"], previous=False)
    waiting = state.get("waiting") or {}
    restarted = int(st.get("restartCount") or 0) > 0
    if waiting.get("reason") in STUCK_WAITING or (strict and restarted):
        if last:
            return _terminated(last, previous=True)
        return Failure(None, str(waiting.get("reason")), str(waiting.get("message") or ""), False)
    return None


def _terminated(term: Obj, previous: bool) -> Failure:
    code = term.get("exitCode")
    return Failure(
        int(code) if code is not None else None,
        str(term.get("reason") or "Error"),
        str(term.get("message") or ""),
        previous,
    )


def pod_summary(pod: Obj, name: str) -> str:
    st = container_status(pod, name) or {}
    state = st.get("state") or {}
    what = next(iter(state), "no container yet")
    detail = (state.get(what) or {}).get("reason") if isinstance(state.get(what), dict) else None
    phase = (pod.get("status") or {}).get("phase", "?")
    ready = "ready" if pod_ready(pod) else "not ready"
    return f"{pod_name(pod)}: {phase}, {what}{f' ({detail})' if detail else ''}, {ready}"
