"""GitOps-managed workloads, the pure part: who manages a workload, read from the marks Argo CD
and Flux leave on it, and the JSON Patch a person commits instead of kvpilot's patch."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from kubernetes.client import ApiClient, V1Deployment, V1StatefulSet

from playbooks.engines.sglang.allow_list import with_change
from playbooks.launchers.gitops import (
    ManagedByGitOps,
    Manager,
    commit_patch,
    managers,
    render,
    stop_patch,
)
from playbooks.launchers.kube_objects import (
    STAMP,
    annotation_ops,
    args_ops,
    server_args,
    templates,
)
from tests.playbooks.launchers.fake_kubernetes import json_patch
from tests.playbooks.launchers.harness import deployment, leaderworkerset, twin_args

ARGS = twin_args(30000)
NEW = with_change(ARGS, {"mem_fraction_static": 0.88, "chunked_prefill_size": 4096})


def marked(
    obj: dict[str, Any],
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The workload with these labels and annotations added to its own metadata."""
    obj = copy.deepcopy(obj)
    meta = obj["metadata"]
    meta["labels"] = {**(meta.get("labels") or {}), **(labels or {})}
    meta["annotations"] = {**(meta.get("annotations") or {}), **(annotations or {})}
    return obj


DEP = deployment(ARGS, 30000)  # Deployment sglang/sglang
STS = deployment(ARGS, 30000, kind="StatefulSet")
TRACKING = "argocd.argoproj.io/tracking-id"
INSTANCE = "app.kubernetes.io/instance"
KS = "kustomize.toolkit.fluxcd.io"
HR = "helm.toolkit.fluxcd.io"
# What `helm install sglang ./chart` leaves on a workload (Helm's recommended labels, and the
# release annotations Helm 3 adds): no GitOps tool is behind it.
HELM_LABELS = {
    INSTANCE: "sglang",
    "app.kubernetes.io/name": "sglang",
    "app.kubernetes.io/managed-by": "Helm",
    "helm.sh/chart": "sglang-0.3.1",
}
HELM_ANNOTATIONS = {
    "meta.helm.sh/release-name": "sglang",
    "meta.helm.sh/release-namespace": "sglang",
}


def argo(name: str, namespace: str | None, mark: str) -> Manager:
    return Manager("Argo CD", "Application", name, namespace, mark)


CASES: list[tuple[str, dict[str, Any], list[Manager]]] = [
    ("unmarked", DEP, []),
    (
        "Argo CD annotation tracking",
        marked(DEP, annotations={TRACKING: "llm-serving:apps/Deployment:sglang/sglang"}),
        [argo("llm-serving", None, f"annotation {TRACKING}")],
    ),
    (
        "Argo CD annotation+label tracking (the label is informational)",
        marked(
            STS,
            labels={INSTANCE: "llm-serving"},
            annotations={TRACKING: "llm-serving:apps/StatefulSet:sglang/sglang"},
        ),
        [argo("llm-serving", None, f"annotation {TRACKING}")],
    ),
    (
        "an Application in another namespace than Argo CD's",
        marked(DEP, annotations={TRACKING: "team-a_llm:apps/Deployment:sglang/sglang"}),
        [argo("llm", "team-a", f"annotation {TRACKING}")],
    ),
    (
        "a copy of another object's tracking annotation: Argo CD ignores it",
        marked(DEP, annotations={TRACKING: "llm-serving:apps/Deployment:sglang/sglang-canary"}),
        [],
    ),
    (
        "a tracking annotation of another kind",
        marked(DEP, annotations={TRACKING: "llm-serving:apps/StatefulSet:sglang/sglang"}),
        [],
    ),
    ("a malformed tracking annotation", marked(DEP, annotations={TRACKING: "llm-serving"}), []),
    (
        "a tracking annotation decides; a copied label does not bring it back",
        marked(
            DEP,
            labels={INSTANCE: "llm-serving"},
            annotations={TRACKING: "other:apps/Deployment:sglang/other"},
        ),
        [],
    ),
    (
        "Argo CD label tracking, with an Argo CD annotation",
        marked(
            DEP,
            labels={INSTANCE: "llm-serving"},
            annotations={"argocd.argoproj.io/sync-wave": "2"},
        ),
        [
            argo(
                "llm-serving",
                None,
                f"label {INSTANCE} with annotation argocd.argoproj.io/sync-wave",
            )
        ],
    ),
    (
        "Argo CD's custom tracking label",
        marked(DEP, labels={"argocd.argoproj.io/instance": "llm-serving"}),
        [argo("llm-serving", None, "label argocd.argoproj.io/instance")],
    ),
    ("a plain Helm release", marked(DEP, labels=HELM_LABELS, annotations=HELM_ANNOTATIONS), []),
    ("the instance label alone", marked(DEP, labels={INSTANCE: "llm-serving"}), []),
    (
        "a Flux Kustomization",
        marked(DEP, labels={f"{KS}/name": "apps", f"{KS}/namespace": "flux-system"}),
        [Manager("Flux", "Kustomization", "apps", "flux-system", f"label {KS}/name")],
    ),
    (
        "a Flux Kustomization that leaves this object alone",
        marked(
            DEP,
            labels={f"{KS}/name": "apps", f"{KS}/namespace": "flux-system"},
            annotations={f"{KS}/reconcile": "disabled"},
        ),
        [],
    ),
    (
        "a Flux HelmRelease (the chart's Helm labels as well)",
        marked(
            STS,
            labels={**HELM_LABELS, f"{HR}/name": "sglang", f"{HR}/namespace": "flux-system"},
            annotations=HELM_ANNOTATIONS,
        ),
        [Manager("Flux", "HelmRelease", "sglang", "flux-system", f"label {HR}/name")],
    ),
    (
        "a LeaderWorkerSet tracked by Argo CD",
        marked(
            leaderworkerset(ARGS, 30000),
            annotations={TRACKING: "kimi:leaderworkerset.x-k8s.io/LeaderWorkerSet:sglang/sglang"},
        ),
        [argo("kimi", None, f"annotation {TRACKING}")],
    ),
]


@pytest.mark.parametrize(("obj", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_who_manages_a_workload(obj: dict[str, Any], want: list[Manager]) -> None:
    assert managers(obj) == want


def test_a_workload_applied_by_both_flux_controllers_names_both() -> None:
    obj = marked(
        DEP,
        labels={
            f"{HR}/name": "sglang",
            f"{HR}/namespace": "llm",
            f"{KS}/name": "apps",
            f"{KS}/namespace": "flux-system",
        },
    )
    assert [m.describe() for m in managers(obj)] == [
        "Flux HelmRelease llm/sglang",
        "Flux Kustomization flux-system/apps",
    ]


def container(obj: dict[str, Any], template: str = "") -> dict[str, Any]:
    spec = obj["spec"]
    t = spec["template"] if not template else spec["leaderWorkerTemplate"][template]
    return dict(t["spec"]["containers"][0])


def flags_in_command(obj: dict[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    c = obj["spec"]["template"]["spec"]["containers"][0]
    c["command"] = [*c["command"], *c.pop("args")]
    return obj


def launcher_result(obj: dict[str, Any], args: list[str]) -> dict[str, Any]:
    """The object as the launcher's own patch leaves it, without its restart stamps."""
    ts = templates(obj["kind"], obj, "sglang", None)
    stamps = [op for t in ts for op in annotation_ops(t.pointer, t.body, STAMP, "now")]
    patched = json_patch(obj, args_ops(ts, args) + stamps)
    for t in ts:
        pointer = t.pointer.strip("/").split("/")
        target = patched
        for part in pointer:
            target = target[part]
        del target["metadata"]["annotations"][STAMP]
        if not target["metadata"]["annotations"]:
            del target["metadata"]["annotations"]
    return patched


@pytest.mark.parametrize(
    ("obj", "paths"),
    [
        (DEP, ["/spec/template/spec/containers/0/args"]),
        (STS, ["/spec/template/spec/containers/0/args"]),
        (
            flags_in_command(DEP),
            ["/spec/template/spec/containers/0/command"],
        ),
        (
            leaderworkerset(ARGS, 30000),
            [
                "/spec/leaderWorkerTemplate/leaderTemplate/spec/containers/0/args",
                "/spec/leaderWorkerTemplate/workerTemplate/spec/containers/0/args",
            ],
        ),
    ],
    ids=["Deployment", "StatefulSet", "flags in the command", "LeaderWorkerSet"],
)
def test_the_patch_to_commit_makes_the_launchers_change(
    obj: dict[str, Any], paths: list[str]
) -> None:
    ts = templates(obj["kind"], obj, "sglang", None)
    new = with_change(server_args(ts[0]), {"mem_fraction_static": 0.88})
    patch = commit_patch(ts, new)
    assert [op["path"] for op in patch] == paths
    assert {op["op"] for op in patch} == {"add"}  # no tests of the live values, no replace
    committed = json_patch(obj, patch)
    assert committed == launcher_result(obj, new)
    after = templates(obj["kind"], committed, "sglang", None)
    assert server_args(after[0]) == new
    assert json.loads(json.dumps(patch)) == patch  # plain JSON, to be written to a file


def test_a_leaderworkerset_commit_keeps_the_workers_own_flags() -> None:
    obj = leaderworkerset(ARGS, 30000)
    ts = templates("LeaderWorkerSet", obj, "sglang", None)
    new = with_change(server_args(ts[0]), {"mem_fraction_static": 0.88})
    committed = json_patch(obj, commit_patch(ts, new))
    worker = container(committed, "workerTemplate")["args"]
    assert "--skip-server-warmup" in worker and "$(LWS_WORKER_INDEX)" in worker
    assert worker[-2:] == ["--mem-fraction-static", "0.88"]
    assert container(committed, "leaderTemplate")["args"] == new


def test_an_args_list_the_flags_moved_out_of_is_removed() -> None:
    obj = copy.deepcopy(DEP)
    c = obj["spec"]["template"]["spec"]["containers"][0]
    c["command"] = [*c["command"], "--preset", "x"]
    c["args"] = ["--port", "30000"]
    ts = templates("Deployment", obj, "sglang", None)
    patch = commit_patch(ts, NEW)
    assert [op["op"] for op in patch] == ["add", "remove"]
    committed = json_patch(obj, patch)
    assert "args" not in container(committed)
    assert container(committed)["command"][-len(NEW) :] == NEW


def test_committed_objects_stay_valid_for_the_api_models() -> None:
    for obj, model in ((DEP, V1Deployment), (STS, V1StatefulSet)):
        ts = templates(obj["kind"], obj, "sglang", None)
        checked = ApiClient().sanitize_for_serialization(  # type: ignore[no-untyped-call]
            model.from_dict(json_patch(obj, commit_patch(ts, NEW)))
        )
        assert checked["spec"]["template"]["spec"]["containers"][0]["args"] == NEW
    assert json_patch(DEP, stop_patch())["spec"]["replicas"] == 0


def test_the_refusal_names_the_tool_and_carries_the_patch() -> None:
    obj = marked(DEP, labels={f"{KS}/name": "apps", f"{KS}/namespace": "flux-system"})
    found = managers(obj)
    patch = commit_patch(templates("Deployment", obj, "sglang", None), NEW)
    error = ManagedByGitOps("Deployment sglang/sglang", found, patch)
    assert error.patch == patch and error.managers == found
    assert error.reason.startswith(
        "Deployment sglang/sglang is managed by Flux Kustomization flux-system/apps (label "
        "kustomize.toolkit.fluxcd.io/name): kvpilot does not patch it, because Flux's next sync "
        "would undo the change. Commit this JSON Patch (RFC 6902, on Deployment sglang/sglang) "
        "to the source that Flux Kustomization flux-system/apps syncs from"
    )
    text = render("Deployment sglang/sglang", found[0], patch)
    first, _, rest = text.partition("\n")
    assert "Flux Kustomization flux-system/apps" in first
    assert json.loads(rest) == patch
    assert error.reason.endswith(rest)
