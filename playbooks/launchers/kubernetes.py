"""The `kubernetes` launcher: the server runs as a Deployment, StatefulSet or LeaderWorkerSet.

It talks to the API server with the official Kubernetes client. `apply` patches the SGLang
arguments of the pod template's container (both templates of a LeaderWorkerSet) with a JSON Patch
that tests the old value first, and stamps the template (`kvpilot.io/restarted-at`) so that every
apply rolls the pods out, as `kubectl rollout restart` does. It then waits for the rollout: the
controller has seen the new generation, every replica is updated and ready, the pods of this
apply run, and the server answers its readiness path. A container of the new pods that terminates or
crash-loops is a failure, explained from its exit code and its log. Rolling back is the same
patch with the previous arguments. StatefulSets (and the StatefulSets a LeaderWorkerSet runs on)
do not replace a broken pod by themselves (Kubernetes' "forced rollback"), so kvpilot deletes
pods of an older template that are not ready. The permissions this needs are exactly those in
`deploy/kubernetes/rbac.yaml`.

A workload that Argo CD or Flux manages is never written to (gitops.py): the next sync would undo
the change. `start` (and so `issue` and `apply`) and `stop` raise `ManagedByGitOps`, carrying the
JSON Patch to commit to the source instead; `permissions` reports it; `poll_ready` deletes no pods
of a rollout the GitOps tool made.

Why it is long: Deployments, StatefulSets and LeaderWorkerSets are patched, rolled and read
through one client, with the GitOps checks beside the patch they guard.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import yaml
from kubernetes import client, config
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from playbooks.clock import Clock, WallClock
from playbooks.engines import default_engine
from playbooks.engines.base import Engine
from playbooks.launchers.base import Finding, LaunchError, ServerIdentity, ServerState
from playbooks.launchers.common import StartThenWait, health_ok, poll_until, still_starting
from playbooks.launchers.gitops import (
    ManagedByGitOps,
    commit_patch,
    describe,
    managers,
    stop_patch,
)
from playbooks.launchers.kube_objects import (
    LWS_GROUP,
    LWS_PLURAL,
    LWS_VERSION,
    REPLICAS_BEFORE_STOP,
    STAMP,
    Obj,
    Op,
    Template,
    annotation,
    annotation_ops,
    args_ops,
    container_running,
    deleting,
    escape,
    expected_pods,
    failure,
    label_selector,
    pod_name,
    pod_ready,
    pod_summary,
    pods_identity,
    replicas,
    rollout_complete,
    server_args,
    stalled,
    template_of,
    templates,
)

T = TypeVar("T")
JSON_PATCH = "application/json-patch+json"


@dataclass(frozen=True)
class KubernetesSpec:
    workload: str  # Deployment | StatefulSet | LeaderWorkerSet
    name: str
    url: str  # the server's HTTP address (a Service, or the leader's), for readiness
    namespace: str = "default"
    container: str | None = None  # the SGLang container; needed when a pod has several
    worker_container: str | None = None  # a LeaderWorkerSet's worker container, if named apart
    kubeconfig: str | None = None  # default: in-cluster credentials, else ~/.kube/config
    context: str | None = None
    ready_timeout_s: float = 1800.0  # on the clock
    request_timeout_s: float = 30.0
    engine: Engine = field(default_factory=default_engine)  # whose signatures to read


class KubernetesLauncher(StartThenWait[KubernetesSpec]):
    kind = "kubernetes"

    def __init__(
        self, spec: KubernetesSpec, clock: Clock | None = None, api: ApiClient | None = None
    ) -> None:
        self.spec = spec
        self.clock = clock or WallClock()
        self._api = api
        self._stamp: str | None = None
        self._forced: set[str] = set()

    @property
    def what(self) -> str:
        return f"{self.spec.workload} {self.spec.namespace}/{self.spec.name}"

    # ----------------------------------------------------------------- the API
    def api(self) -> ApiClient:
        if self._api is None:
            self._api = _load_client(self.spec)
        return self._api

    def _call(self, action: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except ApiException as exc:
            raise LaunchError(self._explain(action, exc.status, exc.body or exc.reason)) from None
        except (HTTPError, OSError) as exc:
            host = self.api().configuration.host
            raise LaunchError(f"cannot reach the Kubernetes API at {host}: {exc}") from None
        except ValueError as exc:  # the client's models refused the answer (pydantic)
            raise LaunchError(f"cannot {action}: the API's answer does not parse: {exc}") from None

    def _explain(self, action: str, status: int | None, body: object) -> str:
        message = str(body)
        with contextlib.suppress(ValueError, AttributeError):
            message = str(json.loads(str(body)).get("message", message))
        if status == 403:
            return (
                f"Kubernetes refused to {action}: {message} (give kvpilot's ServiceAccount the "
                "Role in deploy/kubernetes/rbac.yaml, in this namespace)"
            )
        if status == 404:
            return f"cannot {action}: {message} (check workload, name and namespace)"
        if status in (409, 422) and action.startswith("patch"):
            return (
                f"cannot {action}: {message} (the object changed while kvpilot updated it; "
                "run the change again)"
            )
        return f"cannot {action}: Kubernetes answered {status}: {message}"

    def permissions(self) -> list[Finding]:
        """The workload can be read, and the API server's access review (what `kubectl auth
        can-i` asks) allows every call a restart makes: deploy/kubernetes/rbac.yaml's rules."""
        try:
            obj = self.read()
            spec = obj.get("spec") or {}
            found = [Finding(True, f"{self.what}: {spec.get('replicas', 1)} replica(s)")]
            denied = [
                f"{verb} {resource}" + (f" {name}" if name else "")
                for verb, group, resource, name in self.accesses()
                if not self.allowed(verb, group, resource, name)
            ]
        except LaunchError as exc:
            return [Finding(False, exc.reason, "")]
        found += gitops_findings(self.what, obj)
        if denied:
            found.append(
                Finding(
                    False,
                    f"Kubernetes does not allow kvpilot to {', '.join(denied)} in namespace "
                    f"{self.spec.namespace}",
                    "apply deploy/kubernetes/rbac.yaml (its Role and RoleBinding) in this "
                    "namespace, for the account kvpilot uses",
                )
            )
        else:
            found.append(Finding(True, "access review: every call a restart makes is allowed"))
        return found

    def accesses(self) -> list[tuple[str, str, str, str]]:
        """(verb, API group, resource, name) of each call a restart makes."""
        group, resource = {
            "Deployment": ("apps", "deployments"),
            "StatefulSet": ("apps", "statefulsets"),
        }.get(self.spec.workload, (LWS_GROUP, LWS_PLURAL))
        return [
            ("get", group, resource, self.spec.name),
            ("patch", group, resource, self.spec.name),
            ("list", "", "pods", ""),
            ("delete", "", "pods", ""),
            ("get", "", "pods/log", ""),
        ]

    def allowed(self, verb: str, group: str, resource: str, name: str) -> bool:
        resource, _, sub = resource.partition("/")
        review = client.V1SelfSubjectAccessReview(
            spec=client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=client.V1ResourceAttributes(
                    namespace=self.spec.namespace,
                    verb=verb,
                    group=group,
                    resource=resource,
                    subresource=sub or None,
                    name=name or None,
                )
            )
        )
        api = client.AuthorizationV1Api(self.api())
        answer = self._call(
            "ask for an access review",
            lambda: api.create_self_subject_access_review(
                review, _request_timeout=self.spec.request_timeout_s
            ),
        )
        return bool(cast(Any, answer).status.allowed)

    def read(self) -> Obj:
        api = self.api()
        ns, name, timeout = self.spec.namespace, self.spec.name, self.spec.request_timeout_s
        action = f"read {self.what}"
        if self.spec.workload == "Deployment":
            model: object = self._call(
                action,
                lambda: client.AppsV1Api(api).read_namespaced_deployment(
                    name, ns, _request_timeout=timeout
                ),
            )
        elif self.spec.workload == "StatefulSet":
            model = self._call(
                action,
                lambda: client.AppsV1Api(api).read_namespaced_stateful_set(
                    name, ns, _request_timeout=timeout
                ),
            )
        else:
            model = self._call(
                action,
                lambda: client.CustomObjectsApi(api).get_namespaced_custom_object(
                    LWS_GROUP, LWS_VERSION, ns, LWS_PLURAL, name, _request_timeout=timeout
                ),
            )
        return plain(api, model)

    def patch(self, ops: list[Op]) -> None:
        api = self.api()
        ns, name, timeout = self.spec.namespace, self.spec.name, self.spec.request_timeout_s
        action = f"patch {self.what}"
        if self.spec.workload == "Deployment":
            self._call(
                action,
                lambda: client.AppsV1Api(api).patch_namespaced_deployment(
                    name, ns, ops, _content_type=JSON_PATCH, _request_timeout=timeout
                ),
            )
        elif self.spec.workload == "StatefulSet":
            self._call(
                action,
                lambda: client.AppsV1Api(api).patch_namespaced_stateful_set(
                    name, ns, ops, _content_type=JSON_PATCH, _request_timeout=timeout
                ),
            )
        else:
            self._call(
                action,
                lambda: client.CustomObjectsApi(api).patch_namespaced_custom_object(
                    LWS_GROUP,
                    LWS_VERSION,
                    ns,
                    LWS_PLURAL,
                    name,
                    ops,
                    _content_type=JSON_PATCH,
                    _request_timeout=timeout,
                ),
            )

    def pods(self, obj: Obj) -> list[Obj]:
        api = self.api()
        selector = label_selector(self.spec.workload, obj)
        result = self._call(
            f"list the pods of {self.what}",
            lambda: client.CoreV1Api(api).list_namespaced_pod(
                self.spec.namespace,
                label_selector=selector,
                _request_timeout=self.spec.request_timeout_s,
            ),
        )
        data = plain(api, result)
        return [dict(p) for p in data.get("items") or []]

    def delete_pod(self, name: str) -> None:
        api = self.api()
        self._call(
            f"delete pod {self.spec.namespace}/{name}",
            lambda: client.CoreV1Api(api).delete_namespaced_pod(
                name, self.spec.namespace, _request_timeout=self.spec.request_timeout_s
            ),
        )

    def pod_log(self, pod: str, container: str, previous: bool) -> str:
        api = self.api()
        try:
            text = self._call(
                f"read the log of pod {self.spec.namespace}/{pod}",
                lambda: client.CoreV1Api(api).read_namespaced_pod_log(
                    pod,
                    self.spec.namespace,
                    container=container,
                    previous=previous,
                    tail_lines=300,
                    _request_timeout=self.spec.request_timeout_s,
                ),
            )
        except LaunchError as exc:
            return f"(no log: {exc.reason})"
        return str(text)

    def _templates(self, obj: Obj) -> list[Template]:
        return templates(self.spec.workload, obj, self.spec.container, self.spec.worker_container)

    # ----------------------------------------------------------------- interface
    def current_args(self) -> list[str]:
        return server_args(self._templates(self.read())[0])

    def state(self) -> ServerState:
        obj = self.read()
        if replicas(obj) == 0:
            note = " by `kvpilot server stop`" if annotation(obj, REPLICAS_BEFORE_STOP) else ""
            return ServerState(False, False, None, None, f"scaled to zero replicas{note}")
        ts = self._templates(obj)
        current = self._current_pods(obj, ts)
        for pod, t in current:
            why = failure(pod, t.container, strict=False)
            if why is not None:
                log = self.pod_log(pod_name(pod), t.container, why.previous)
                cause = why.cause(log, self.spec.engine)
                return ServerState(False, False, None, why.exit_code, cause.reason, cause)
        want = expected_pods(self.spec.workload, obj)
        running = [p for p, t in current if container_running(p, t.container)]
        if len(running) < want:
            return ServerState(
                False,
                False,
                None,
                None,
                f"{len(running)} of {want} pods run the current template (a rollout is under "
                "way, or pods are pending)",
            )
        ready = all(pod_ready(p) for p, _ in current) and health_ok(self.spec.url, self.spec.engine)
        return ServerState(True, ready, None, None, "" if ready else "starting or not ready")

    def start(self, args: list[str]) -> None:
        obj = self.read()
        ts = self._templates(obj)
        self._refuse_if_managed(obj, lambda: commit_patch(ts, args))
        stamp = datetime.now(UTC).isoformat(timespec="microseconds")
        ops = args_ops(ts, args)
        for t in ts:
            ops += annotation_ops(t.pointer, t.body, STAMP, stamp)
        before = annotation(obj, REPLICAS_BEFORE_STOP)
        if replicas(obj) == 0 and before is not None:
            ops += [
                {"op": "test", "path": "/spec/replicas", "value": 0},
                {"op": "replace", "path": "/spec/replicas", "value": int(before)},
                {"op": "remove", "path": f"/metadata/annotations/{escape(REPLICAS_BEFORE_STOP)}"},
            ]
        self.patch(ops)
        self._stamp = stamp
        self._forced = set()

    def poll_ready(self) -> bool:
        """One look at the rollout: a failed pod or a stalled rollout raises; StatefulSets and
        LeaderWorkerSets get their stuck older pods deleted (`_force_rollback`)."""
        kind = self.spec.workload
        obj = self.read()
        ts = self._templates(obj)
        pods = self.pods(obj)
        current = self._current_pods(obj, ts, pods)
        for pod, t in current:
            why = failure(pod, t.container, strict=True)
            if why is not None:
                log = self.pod_log(pod_name(pod), t.container, why.previous)
                cause = why.cause(log, self.spec.engine)
                raise LaunchError(
                    f"pod {pod_name(pod)} of {self.what} failed before it was ready: "
                    f"{cause.reason}",
                    log,
                    cause=cause,
                )
        problem = stalled(kind, obj)
        if problem:
            raise LaunchError(f"the rollout of {self.what} stalled: {problem}")
        if kind in ("StatefulSet", "LeaderWorkerSet") and not managers(obj):
            # A managed workload's rollout is its GitOps tool's, not one kvpilot started.
            self._force_rollback(pods, {pod_name(p) for p, _ in current})
        live = [p for p in pods if not deleting(p)]
        return (
            rollout_complete(kind, obj)
            and len(current) == expected_pods(kind, obj) == len(live)
            and all(pod_ready(p) for p, _ in current)
            and health_ok(self.spec.url, self.spec.engine)
        )

    def give_up(self) -> str:
        """Nothing to undo: the pods stay as the controller has them, for `kubectl describe`.
        The log of the first pod of the new template that serves, for the record."""
        obj = self.read()
        ts = self._templates(obj)
        for pod, t in self._current_pods(obj, ts):
            if t.primary:
                return self.pod_log(pod_name(pod), t.container, False)
        return ""

    def wait_ready(self) -> None:
        if not poll_until(self.clock, self.spec.ready_timeout_s, self.poll_ready):
            obj = self.read()
            ts = self._templates(obj)
            summary = "; ".join(pod_summary(p, ts[0].container) for p in self.pods(obj))
            raise still_starting(
                f"{self.what} (pods: {summary or 'none'})",
                self.spec.ready_timeout_s,
                self.give_up(),
                "its pods were left as they are",
            )

    def identity(self) -> ServerIdentity | None:
        obj = self.read()
        if replicas(obj) == 0:
            return None
        current = self._current_pods(obj, self._templates(obj))
        return pods_identity(current, expected_pods(self.spec.workload, obj))

    def stop(self) -> None:
        """Scale to zero, remembering the replica count for the next start."""
        obj = self.read()
        count = replicas(obj)
        if count > 0:
            self._refuse_if_managed(obj, stop_patch)
            self.patch(
                [
                    {"op": "test", "path": "/spec/replicas", "value": count},
                    {"op": "replace", "path": "/spec/replicas", "value": 0},
                    *annotation_ops("", obj, REPLICAS_BEFORE_STOP, str(count)),
                ]
            )

        def gone() -> bool:
            return not [p for p in self.pods(obj) if not deleting(p)]

        if not poll_until(self.clock, self.spec.ready_timeout_s, gone):
            raise LaunchError(f"the pods of {self.what} were still there after scaling to zero")

    # ----------------------------------------------------------------- helpers
    def refusal(self, args: list[str]) -> LaunchError | None:
        """A GitOps-managed workload, read now: the refusal `start` would raise, with the patch
        to commit; None when kvpilot may patch it."""
        obj = self.read()
        found = managers(obj)
        if not found:
            return None
        return ManagedByGitOps(self.what, found, commit_patch(self._templates(obj), args))

    def _refuse_if_managed(self, obj: Obj, patch: Callable[[], list[Op]]) -> None:
        """Raise, having written nothing, when a GitOps tool manages the workload: `patch` is
        the change to commit to its source instead."""
        found = managers(obj)
        if found:
            raise ManagedByGitOps(self.what, found, patch())

    def _current_pods(
        self, obj: Obj, ts: list[Template], pods: list[Obj] | None = None
    ) -> list[tuple[Obj, Template]]:
        out = []
        for pod in self.pods(obj) if pods is None else pods:
            t = template_of(pod, ts)
            if t is not None and not deleting(pod):
                out.append((pod, t))
        return out

    def _force_rollback(self, pods: list[Obj], current: set[str]) -> None:
        """Delete pods of an older template that are not ready: their controller waits forever."""
        for pod in pods:
            name = pod_name(pod)
            if name in current or deleting(pod) or pod_ready(pod) or name in self._forced:
                continue
            self._forced.add(name)
            self.delete_pod(name)


def gitops_findings(what: str, obj: Obj) -> list[Finding]:
    """`kvpilot doctor`'s line for a GitOps-managed workload: a restart will be refused."""
    found = managers(obj)
    if not found:
        return []
    return [
        Finding(
            False,
            f"{what} is managed by {describe(found)}: kvpilot will not patch it, because the "
            "next sync would undo the change",
            "commit argument changes to the source it syncs from (kvpilot gives the JSON Patch "
            "to commit with each change it is refused); kvpilot can still diagnose and propose",
        )
    ]


def plain(api: ApiClient, model: object) -> Obj:
    """An API object as the API's JSON (camelCase keys), whatever the client returned."""
    return cast(Obj, cast(Any, api).sanitize_for_serialization(model))


def _load_client(spec: KubernetesSpec) -> ApiClient:
    loader = cast(Any, config)  # the config loaders carry no type annotations
    try:
        if spec.kubeconfig or spec.context:
            return cast(
                ApiClient,
                loader.new_client_from_config(
                    config_file=spec.kubeconfig, context=spec.context, persist_config=False
                ),
            )
        try:
            configuration = client.Configuration()
            loader.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
        except config.ConfigException:
            return cast(ApiClient, loader.new_client_from_config(persist_config=False))
    except (config.ConfigException, OSError, ValueError, TypeError, yaml.YAMLError) as exc:
        raise LaunchError(
            f"cannot load Kubernetes credentials: {exc} (set kubeconfig, and context if needed, "
            "in [servers.NAME.launcher], or run kvpilot in the cluster with a ServiceAccount)"
        ) from None
