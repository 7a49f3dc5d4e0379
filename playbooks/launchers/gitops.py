"""Workloads that Argo CD or Flux manage: who manages them, and the change to commit instead.

Both tools apply manifests from a source (Git, OCI, a Helm chart) and bring the cluster back to
it: a patch that kvpilot makes to such a workload is undone by the next sync, and with Argo CD's
self-heal or Flux's drift correction the controller fights it within minutes. So the kubernetes
launcher patches no GitOps-managed workload. It raises `ManagedByGitOps` instead, with the
change as a JSON Patch (RFC 6902) that a person commits to the source; kvpilot still reads the
workload, diagnoses and proposes. Everything here is pure: it reads the workload object as the
API returns it (camelCase JSON).

How a workload is recognised, from the marks each tool leaves on what it applies:

- Argo CD, annotation tracking (the default since Argo CD 3.0): the annotation
  `argocd.argoproj.io/tracking-id: <app>:<group>/<kind>:<namespace>/<name>`. Argo CD only
  compares a resource whose annotation names that resource itself; a copy carrying another
  object's annotation is left alone, and so is it here. Sources: Argo CD's "Resource Tracking"
  page (docs/user-guide/resource_tracking.md, "Non self-referencing annotations"),
  util/argo/resource_tracking.go (ParseAppInstanceValue) and the 2.14 to 3.0 upgrade notes.
- Argo CD, label tracking (the default before 3.0): the label `app.kubernetes.io/instance`
  holds the Application's name. Plain Helm charts set that same label to their release name
  (Helm's recommended labels), and Argo CD's own page lists that clash as the reason for
  annotation tracking; a Helm-installed workload carrying it is not managed by anyone who would
  undo a patch. So the label counts only together with a mark that only Argo CD users write: an
  `argocd.argoproj.io/*` annotation on the object (sync-wave, sync-options, compare-options,
  hook, installation-id, ...). The label `argocd.argoproj.io/instance`, the custom tracking
  label the same page configures as its example, counts alone. A workload tracked by the plain
  label without any Argo CD annotation cannot be told from a Helm release and is not detected:
  switch Argo CD to annotation tracking, or add any `argocd.argoproj.io/` annotation to it.
- An Argo CD Application outside Argo CD's own namespace ("apps in any namespace") is written
  `<namespace>_<name>` in both marks (Application.InstanceName in Argo CD's
  pkg/apis/application/v1alpha1/types.go); names cannot hold `_`, so the split is exact.
- Flux: kustomize-controller labels everything a Kustomization applies with
  `kustomize.toolkit.fluxcd.io/name` and `/namespace` (ssa ResourceManager.SetOwnerLabels;
  the Kustomization API docs list objects by these labels), and helm-controller's post-renderer
  labels everything a HelmRelease renders with `helm.toolkit.fluxcd.io/name` and `/namespace`
  (internal/postrender/origin_labels.go). kustomize-controller leaves alone an object labelled
  or annotated `kustomize.toolkit.fluxcd.io/reconcile: disabled` ("the controller will no
  longer apply changes, nor will it prune the resource", Kustomization API docs, "Suspending and
  resuming"), so that one is not counted as managed by its Kustomization.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from playbooks.launchers.base import LaunchError
from playbooks.launchers.kube_objects import Obj, Op, Template, args_ops

ARGO_TRACKING_ID = "argocd.argoproj.io/tracking-id"
ARGO_INSTANCE_LABEL = "app.kubernetes.io/instance"
ARGO_CUSTOM_LABEL = "argocd.argoproj.io/instance"
ARGO_PREFIX = "argocd.argoproj.io/"
FLUX_KUSTOMIZE = "kustomize.toolkit.fluxcd.io"
FLUX_HELM = "helm.toolkit.fluxcd.io"
FLUX_RECONCILE = "kustomize.toolkit.fluxcd.io/reconcile"


@dataclass(frozen=True)
class Manager:
    """The GitOps object whose source holds the workload, as the workload's marks name it."""

    tool: str  # "Argo CD" or "Flux"
    kind: str  # the tool's object: Application, Kustomization or HelmRelease
    name: str
    namespace: str | None  # None: not recorded (an Application in Argo CD's own namespace)
    mark: str  # the label or annotation it was read from, for the operator to check

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    def describe(self) -> str:
        return f"{self.tool} {self.kind} {self.ref}"


def managers(obj: Obj) -> list[Manager]:
    """Every GitOps tool that manages this workload; empty when kvpilot may patch it."""
    found = [_argo(obj), _flux(obj, FLUX_HELM, "HelmRelease"), _flux_kustomization(obj)]
    return [m for m in found if m is not None]


def _meta(obj: Obj, key: str) -> dict[str, str]:
    return {str(k): str(v) for k, v in ((obj.get("metadata") or {}).get(key) or {}).items()}


def _argo(obj: Obj) -> Manager | None:
    annotations, labels = _meta(obj, "annotations"), _meta(obj, "labels")
    tracking = annotations.get(ARGO_TRACKING_ID)
    if tracking is not None:
        # Where the annotation is, Argo CD tracks by it alone; the label is informational.
        app = _tracked_app(tracking, obj)
        return None if app is None else _argo_manager(app, f"annotation {ARGO_TRACKING_ID}")
    if ARGO_CUSTOM_LABEL in labels:
        return _argo_manager(labels[ARGO_CUSTOM_LABEL], f"label {ARGO_CUSTOM_LABEL}")
    argo_marks = sorted(k for k in annotations if k.startswith(ARGO_PREFIX))
    if ARGO_INSTANCE_LABEL in labels and argo_marks:
        return _argo_manager(
            labels[ARGO_INSTANCE_LABEL],
            f"label {ARGO_INSTANCE_LABEL} with annotation {argo_marks[0]}",
        )
    return None


def _tracked_app(tracking: str, obj: Obj) -> str | None:
    """The application of `<app>:<group>/<kind>:<namespace>/<name>` when it names `obj`."""
    parts = tracking.split(":", 2)
    if len(parts) != 3:
        return None
    app, gk, nn = parts
    group_kind, ns_name = gk.split("/"), nn.split("/")
    if not app or len(group_kind) != 2 or len(ns_name) != 2:
        return None
    meta = obj.get("metadata") or {}
    api_version = str(obj.get("apiVersion") or "")
    seen = {
        "group": api_version.rpartition("/")[0] if api_version else None,
        "kind": obj.get("kind"),
        "namespace": meta.get("namespace"),
        "name": meta.get("name"),
    }
    named = dict(zip(("group", "kind", "namespace", "name"), group_kind + ns_name, strict=True))
    # A field the object does not carry cannot contradict the annotation.
    if any(seen[k] is not None and seen[k] != v for k, v in named.items()):
        return None
    return app


def _argo_manager(instance: str, mark: str) -> Manager:
    namespace, _, name = instance.rpartition("_")
    return Manager("Argo CD", "Application", name, namespace or None, mark)


def _flux(obj: Obj, group: str, kind: str) -> Manager | None:
    labels = _meta(obj, "labels")
    name = labels.get(f"{group}/name")
    if not name:
        return None
    return Manager("Flux", kind, name, labels.get(f"{group}/namespace"), f"label {group}/name")


def _flux_kustomization(obj: Obj) -> Manager | None:
    marks = {**_meta(obj, "labels"), **_meta(obj, "annotations")}
    if marks.get(FLUX_RECONCILE) == "disabled":
        return None
    return _flux(obj, FLUX_KUSTOMIZE, "Kustomization")


# --------------------------------------------------------------------------- the patch
def commit_patch(ts: list[Template], args: list[str]) -> list[Op]:
    """The argument change to commit to the source, as a JSON Patch on the workload.

    The same edits the launcher would send (`args_ops`: the container's `args`, or `command`
    where the flags are there, in both templates of a LeaderWorkerSet), without the `test`
    guards of the live values and with `add` for `replace`: a person reviews what they commit,
    the source may spell the old value differently, and `add` sets a member whether or not it
    is there (RFC 6902, 4.1). No restart stamp: changed arguments roll the pods out anyway.
    """
    return [_as_edit(op) for op in args_ops(ts, args) if op["op"] != "test"]


def stop_patch() -> list[Op]:
    """`kvpilot server stop` as a change to commit: zero replicas."""
    return [{"op": "add", "path": "/spec/replicas", "value": 0}]


def _as_edit(op: Op) -> Op:
    return {**op, "op": "add"} if op["op"] == "replace" else dict(op)


def render(what: str, owner: Manager, patch: list[Op]) -> str:
    """The patch for a person: one line naming where to commit it, then the JSON."""
    return (
        f"Commit this JSON Patch (RFC 6902, on {what}) to the source that {owner.describe()} "
        f"syncs from, e.g. as a kustomize `patches:` entry targeting it:\n"
        + json.dumps(patch, indent=2)
    )


def describe(found: list[Manager]) -> str:
    return " and ".join(f"{m.describe()} ({m.mark})" for m in found)


class ManagedByGitOps(LaunchError):
    """kvpilot refused to change a GitOps-managed workload; nothing was written.

    `patch` is the JSON Patch (a list of RFC 6902 operations on the workload object) to commit
    to the source instead, and `managers` says which tool and object own it, so that a front
    end can show them as they are.
    """

    wrote_nothing = True

    def __init__(self, what: str, found: list[Manager], patch: list[Op]) -> None:
        self.what = what
        self.managers = list(found)
        self.patch: list[dict[str, Any]] = [dict(op) for op in patch]
        tools = " and ".join(sorted({m.tool for m in found}))
        super().__init__(
            f"{what} is managed by {describe(found)}: kvpilot does not patch it, because "
            f"{tools}'s next sync would undo the change. {render(what, found[0], patch)}"
        )
