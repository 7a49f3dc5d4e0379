"""The kubernetes launcher: objects checked with the official client's models, the patches it
sends, StatefulSet and LeaderWorkerSet roll-outs and roll-backs, and an RBAC Role that grants
exactly what it uses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes.client import (
    ApiClient,
    V1Deployment,
    V1Role,
    V1RoleBinding,
    V1ServiceAccount,
    V1StatefulSet,
)

from playbooks.engines.sglang.allow_list import with_change
from playbooks.launchers.base import LaunchError
from playbooks.launchers.kube_objects import (
    STAMP,
    annotation_ops,
    carry_changes,
    command_ops,
    flag_groups,
    server_args,
    templates,
)
from playbooks.launchers.kubernetes import KubernetesLauncher, KubernetesSpec
from tests.playbooks.launchers.fake_kubernetes import FakeCluster, json_patch
from tests.playbooks.launchers.harness import (
    RBAC,
    Harness,
    deployment,
    kubeconfig,
    kubernetes_harness,
    leaderworkerset,
    twin_args,
)
from tests.playbooks.launchers.serving import serving

ARGS = twin_args(30000)


def statefulset(args: list[str], port: int) -> dict[str, Any]:
    return deployment(args, port, kind="StatefulSet")


def test_patched_objects_stay_valid_for_the_api_models() -> None:
    for obj in (deployment(ARGS, 30000), statefulset(ARGS, 30000)):
        (t,) = templates(obj["kind"], obj, "sglang", None)
        trial = with_change(server_args(t), {"mem_fraction_static": 0.88})
        stamp = "2026-01-01T00:00:00Z"
        patched = json_patch(
            obj, command_ops(t, trial) + annotation_ops(t.pointer, t.body, STAMP, stamp)
        )
        model = V1Deployment if obj["kind"] == "Deployment" else V1StatefulSet
        model.from_dict(obj)
        checked = plain(model.from_dict(patched))
        template = checked["spec"]["template"]
        container = template["spec"]["containers"][0]
        assert container["args"] == trial
        assert container["command"] == obj["spec"]["template"]["spec"]["containers"][0]["command"]
        assert template["metadata"]["annotations"] == {STAMP: stamp}
        assert container["readinessProbe"]["httpGet"]["port"] == 30000
    # The test operation guards against someone else's edit in between.
    obj = deployment(ARGS, 30000)
    (t,) = templates("Deployment", obj, "sglang", None)
    ops = command_ops(t, ARGS)
    obj["spec"]["template"]["spec"]["containers"][0]["args"] = ["--port", "1"]
    with pytest.raises(Exception, match="testing value"):
        json_patch(obj, ops)


def plain(model: object) -> dict[str, Any]:
    """A client model back to the API's JSON."""
    return dict(ApiClient().sanitize_for_serialization(model))  # type: ignore[no-untyped-call]


def test_flags_inside_the_command_are_replaced_there() -> None:
    obj = deployment(ARGS, 30000)
    container = obj["spec"]["template"]["spec"]["containers"][0]
    container["command"] = [*container["command"], *ARGS]
    del container["args"]
    (t,) = templates("Deployment", obj, "sglang", None)
    patched = json_patch(obj, command_ops(t, ["--port", "2"]))
    assert patched["spec"]["template"]["spec"]["containers"][0]["command"][-2:] == ["--port", "2"]
    obj["spec"]["template"]["spec"]["containers"].append({"name": "sidecar", "image": "x"})
    with pytest.raises(LaunchError, match="set `container`"):
        templates("Deployment", obj, None, None)


def test_workers_get_the_leaders_changes_and_keep_their_own_flags() -> None:
    leader = ["--tp", "16", "--mem-fraction-static", "0.85", "--node-rank", "0"]
    worker = ["--tp", "16", "--mem-fraction-static", "0.85", "--node-rank", "$(LWS_WORKER_INDEX)"]
    new = with_change(leader, {"mem_fraction_static": 0.88, "enable_hierarchical_cache": True})
    assert carry_changes(leader, new, worker) == [
        "--tp",
        "16",
        "--node-rank",
        "$(LWS_WORKER_INDEX)",
        "--mem-fraction-static",
        "0.88",
        "--enable-hierarchical-cache",
    ]
    assert carry_changes(new, leader, carry_changes(leader, new, worker))[-2:] == [
        "--mem-fraction-static",
        "0.85",
    ]


def granted(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (verb, group, resource)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_statefulset_and_leaderworkerset_roll_out_and_back_under_exactly_the_rbac_role(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = list(yaml.safe_load_all(RBAC.read_text()))
    assert [d["kind"] for d in docs] == ["ServiceAccount", "Role", "RoleBinding"]
    account, role, binding = (
        plain(V1ServiceAccount.from_dict(docs[0])),
        plain(V1Role.from_dict(docs[1])),
        plain(V1RoleBinding.from_dict(docs[2])),
    )
    assert role["rules"] == docs[1]["rules"]  # nothing the model does not know was dropped
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"][0]["name"] == account["metadata"]["name"]
    rules = next(d for d in docs if d["kind"] == "Role")["rules"]
    used: set[tuple[str, str, str]] = set()

    with kubernetes_harness(tmp_path / "sts", monkeypatch, statefulset) as h:
        roll_back_a_failed_start(h)
        used |= accesses(h)

    with kubernetes_harness(tmp_path / "lws", monkeypatch, leaderworkerset) as h:
        cluster: FakeCluster = h.extra["cluster"]
        launcher = h.launcher()
        lws = cluster.objects[("LeaderWorkerSet", "sglang", "sglang")]
        template = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]
        original = list(template["spec"]["containers"][0]["args"])
        trial = with_change(h.baseline, {"mem_fraction_static": 0.88})
        launcher.apply(trial)
        lws = cluster.objects[("LeaderWorkerSet", "sglang", "sglang")]
        worker = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
        without = with_change(h.baseline, {"mem_fraction_static": None})
        assert worker["args"] == [*without, "--skip-server-warmup", "--mem-fraction-static", "0.88"]
        worker_port = worker["env"][0]["value"]
        info = httpx.get(f"http://127.0.0.1:{worker_port}/server_info", timeout=10).json()
        assert info["mem_fraction_static"] == 0.88 and info["skip_server_warmup"] is True
        assert h.info()["mem_fraction_static"] == 0.88
        launcher.apply(h.baseline)
        lws = cluster.objects[("LeaderWorkerSet", "sglang", "sglang")]
        back = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
        assert dict(flag_groups(back["args"])) == dict(flag_groups(original))
        assert h.info()["mem_fraction_static"] == 0.85 and h.leftovers() == []
        used |= accesses(h)

    # A Deployment scaled to zero: read and patched, no pods.
    with kubernetes_harness(tmp_path / "dep", monkeypatch, scaled_to_zero) as h:
        launcher = h.launcher()
        assert launcher.state().reason == "scaled to zero replicas"
        launcher.start(with_change(h.baseline, {"mem_fraction_static": 0.88}))
        used |= accesses(h)

    assert used == granted(rules)


def scaled_to_zero(args: list[str], port: int) -> dict[str, Any]:
    obj = deployment(args, port)
    obj["spec"]["replicas"] = 0
    return obj


def accesses(h: Harness) -> set[tuple[str, str, str]]:
    cluster: FakeCluster = h.extra["cluster"]
    for a in cluster.accesses:
        if a.resource not in ("pods", "pods/log"):
            assert a.name == "sglang"
    return {(a.verb, a.group, a.resource) for a in cluster.accesses}


def roll_back_a_failed_start(h: Harness) -> None:
    """The controller waits forever on a broken pod; the launcher deletes it to roll back."""
    launcher = h.launcher()
    bad = with_change(h.baseline, {"mem_fraction_static": 0.99})
    with pytest.raises(LaunchError, match="GPU out of memory") as failure:
        launcher.apply(bad)
    assert "CUDA out of memory" in failure.value.log_tail
    launcher.apply(h.baseline)
    assert h.launcher().state().ready
    assert h.info()["mem_fraction_static"] == 0.85
    assert h.leftovers() == []


def test_errors_an_operator_can_act_on(tmp_path: Path) -> None:
    cluster = FakeCluster(rules=[])
    cluster.controllers_running = False  # no pods, and the status stays as set below
    cluster.add(deployment(ARGS, 30000))
    try:
        with serving(cluster.app()) as url:
            config = kubeconfig(tmp_path / "kubeconfig", url)
            spec = KubernetesSpec(
                "Deployment", "sglang", "http://127.0.0.1:9", "sglang", kubeconfig=str(config)
            )
            with pytest.raises(
                LaunchError, match=r"refused to read Deployment sglang/sglang.*cannot get"
            ):
                KubernetesLauncher(spec).current_args()
            wrong = KubernetesSpec(
                "Deployment", "other", "http://127.0.0.1:9", "sglang", kubeconfig=str(config)
            )
            cluster.rules = None
            with pytest.raises(LaunchError, match=r'"other" not found \(check workload, name and'):
                KubernetesLauncher(wrong).current_args()
            cluster.objects[("Deployment", "sglang", "sglang")]["status"] = {"replicas": "many"}
            with pytest.raises(LaunchError, match="the API's answer does not parse"):
                KubernetesLauncher(spec).current_args()
    finally:
        cluster.shutdown()
    absent = KubernetesSpec("Deployment", "sglang", "http://x", kubeconfig=str(tmp_path / "none"))
    with pytest.raises(LaunchError, match="cannot load Kubernetes credentials"):
        KubernetesLauncher(absent).current_args()
    (tmp_path / "broken").write_text("clusters: [\n")
    broken = KubernetesSpec("Deployment", "sglang", "http://x", kubeconfig=str(tmp_path / "broken"))
    with pytest.raises(LaunchError, match="cannot load Kubernetes credentials"):
        KubernetesLauncher(broken).current_args()
