"""The kubernetes launcher on GitOps-managed workloads, against the fake API server: every
change is refused with the patch to commit, and not one write reaches the API server; a plain
Helm release is patched as before."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from playbooks.engines.sglang.allow_list import with_change
from playbooks.launchers.gitops import ManagedByGitOps
from playbooks.launchers.kube_objects import server_args, templates
from playbooks.launchers.kubernetes import KubernetesLauncher, KubernetesSpec
from tests.playbooks.launchers.fake_kubernetes import FakeCluster, Pod, json_patch
from tests.playbooks.launchers.harness import (
    deployment,
    kubeconfig,
    leaderworkerset,
    role_rules,
    twin_args,
)
from tests.playbooks.launchers.serving import serving
from tests.playbooks.launchers.test_gitops import HELM_ANNOTATIONS, HELM_LABELS, marked

ARGS = twin_args(30000)
KS = "kustomize.toolkit.fluxcd.io"
HR = "helm.toolkit.fluxcd.io"


@contextmanager
def launcher_on(obj: dict[str, Any], tmp: Path) -> Iterator[tuple[FakeCluster, KubernetesLauncher]]:
    """The workload on the fake API server under deploy/kubernetes/rbac.yaml's Role, its
    controllers stopped (no pods run: nothing here needs a server), and a launcher for it."""
    cluster = FakeCluster(rules=role_rules())
    cluster.controllers_running = False
    cluster.add(copy.deepcopy(obj))
    try:
        with serving(cluster.app()) as url:
            spec = KubernetesSpec(
                obj["kind"],
                "sglang",
                "http://127.0.0.1:9",
                "sglang",
                container="sglang",
                kubeconfig=str(kubeconfig(tmp / "kubeconfig", url)),
                ready_timeout_s=5.0,  # a launcher that wrongly starts a rollout fails fast
            )
            yield cluster, KubernetesLauncher(spec)
    finally:
        cluster.shutdown()


def stored(cluster: FakeCluster, kind: str) -> dict[str, Any]:
    return copy.deepcopy(cluster.objects[(kind, "sglang", "sglang")])


MANAGED = [
    (
        "Argo CD annotation tracking",
        marked(
            deployment(ARGS, 30000),
            annotations={"argocd.argoproj.io/tracking-id": "llm:apps/Deployment:sglang/sglang"},
        ),
        "Argo CD Application llm",
    ),
    (
        "Argo CD label with an Argo CD annotation",
        marked(
            deployment(ARGS, 30000, kind="StatefulSet"),
            labels={"app.kubernetes.io/instance": "llm"},
            annotations={"argocd.argoproj.io/sync-options": "ServerSideApply=true"},
        ),
        "Argo CD Application llm",
    ),
    (
        "Flux Kustomization",
        marked(
            deployment(ARGS, 30000, kind="StatefulSet"),
            labels={f"{KS}/name": "apps", f"{KS}/namespace": "flux-system"},
        ),
        "Flux Kustomization flux-system/apps",
    ),
    (
        "Flux HelmRelease",
        marked(
            deployment(ARGS, 30000),
            labels={**HELM_LABELS, f"{HR}/name": "sglang", f"{HR}/namespace": "flux-system"},
            annotations=HELM_ANNOTATIONS,
        ),
        "Flux HelmRelease flux-system/sglang",
    ),
    (
        "LeaderWorkerSet under Argo CD",
        marked(
            leaderworkerset(ARGS, 30000),
            annotations={
                "argocd.argoproj.io/tracking-id": (
                    "team-a_kimi:leaderworkerset.x-k8s.io/LeaderWorkerSet:sglang/sglang"
                )
            },
        ),
        "Argo CD Application team-a/kimi",
    ),
]


@pytest.mark.parametrize(("obj", "owner"), [m[1:] for m in MANAGED], ids=[m[0] for m in MANAGED])
def test_a_managed_workload_is_never_written_and_the_patch_to_commit_is_given(
    obj: dict[str, Any], owner: str, tmp_path: Path
) -> None:
    kind = obj["kind"]
    with launcher_on(obj, tmp_path) as (cluster, launcher):
        before = stored(cluster, kind)
        current = launcher.current_args()  # reading is fine
        new = with_change(current, {"mem_fraction_static": 0.88})
        for change in (launcher.apply, launcher.issue, launcher.start):
            with pytest.raises(ManagedByGitOps) as refused:
                change(new)
            error = refused.value
            assert f"{kind} sglang/sglang is managed by {owner} (" in error.reason
            assert "kvpilot does not patch it, because" in error.reason
            assert "next sync would undo the change" in error.reason
            assert f"to the source that {owner} syncs from" in error.reason
            assert '"op": "add"' in error.reason and error.log_tail == ""
            assert [m.describe() for m in error.managers] == [owner]
            committed = json_patch(before, error.patch)
            ts = templates(kind, committed, "sglang", None)
            assert server_args(ts[0]) == new
            if kind == "LeaderWorkerSet":
                worker = server_args(ts[1])
                assert worker[-2:] == ["--mem-fraction-static", "0.88"]
                assert "--skip-server-warmup" in worker
        with pytest.raises(ManagedByGitOps) as stopping:
            launcher.stop()
        assert json_patch(before, stopping.value.patch)["spec"]["replicas"] == 0

        findings = launcher.permissions()
        problems = [f for f in findings if not f.ok]
        assert len(problems) == 1, findings
        assert problems[0].detail.startswith(f"{kind} sglang/sglang is managed by {owner} (")
        assert "next sync would undo the change" in problems[0].detail
        assert "commit argument changes to the source" in problems[0].fix
        assert "diagnose and propose" in problems[0].fix
        assert any(f.ok and "access review" in f.detail for f in findings)

        assert cluster.writes() == []  # no PATCH, PUT, POST or DELETE reached the API server
        assert {a.verb for a in cluster.accesses} == {"get"}
        assert stored(cluster, kind) == before


def test_a_plain_helm_release_is_patched(tmp_path: Path) -> None:
    obj = marked(deployment(ARGS, 30000), labels=HELM_LABELS, annotations=HELM_ANNOTATIONS)
    with launcher_on(obj, tmp_path) as (cluster, launcher):
        assert [f for f in launcher.permissions() if not f.ok] == []
        new = with_change(ARGS, {"mem_fraction_static": 0.88})
        launcher.start(new)
        assert cluster.writes() == [("PATCH", "/apis/apps/v1/namespaces/sglang/deployments/sglang")]
        assert launcher.current_args() == new


def stuck_pod(obj: dict[str, Any]) -> Pod:
    """A crash-looping pod of an older template, which a StatefulSet does not replace itself."""
    spec = copy.deepcopy(obj["spec"]["template"]["spec"])
    spec["containers"][0]["args"] = with_change(ARGS, {"mem_fraction_static": 0.99})
    return Pod(
        name="sglang-0",
        namespace="sglang",
        owner=("StatefulSet", "sglang"),
        slot="sglang-0",
        group="sglang-0",
        role="pod",
        template_hash="older",
        labels={"app": "sglang"},
        annotations={},
        spec=spec,
        extra_env={},
        restarts=3,
        state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s"}},
    )


@pytest.mark.parametrize(
    ("mark", "deletes"),
    [
        (lambda o: marked(o, labels={f"{KS}/name": "apps", f"{KS}/namespace": "flux"}), False),
        (lambda o: o, True),
    ],
    ids=["managed: the rollout is Flux's", "unmanaged: forced rollback"],
)
def test_no_pod_of_a_managed_statefulset_is_deleted(
    mark: Callable[[dict[str, Any]], dict[str, Any]], deletes: bool, tmp_path: Path
) -> None:
    obj = mark(deployment(ARGS, 30000, kind="StatefulSet"))
    with launcher_on(obj, tmp_path) as (cluster, launcher):
        pod = stuck_pod(obj)
        with cluster.lock:
            cluster.pods[("sglang", pod.name)] = pod
        assert launcher.poll_ready() is False
        deleted = [("DELETE", "/api/v1/namespaces/sglang/pods/sglang-0")]
        assert cluster.writes() == (deleted if deletes else [])


def test_a_put_is_recorded_as_a_write(tmp_path: Path) -> None:
    """The check above would see a write by any method, not only the PATCH the launcher uses."""
    with launcher_on(deployment(ARGS, 30000), tmp_path) as (cluster, launcher):
        host = launcher.api().configuration.host
        path = "/apis/apps/v1/namespaces/sglang/deployments/sglang"
        assert httpx.put(host + path, json={}).status_code == 405
        assert cluster.writes() == [("PUT", path)]
