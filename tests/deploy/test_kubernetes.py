"""The Kubernetes manifests in deploy/kubernetes, checked without a cluster.

Every object is validated against the Kubernetes OpenAPI schemas (kubernetes-validate bundles
them per version, strict: a misspelt or unknown field fails), and the properties the bot depends
on are checked against the code and the image: one pod at a time, the database on the volume
claim, the configuration from the ConfigMap (loaded by kvpilot's own parser), tokens only from
the Secret, probes on /healthz, a grace period longer than the bot's stop, and the
ServiceAccount that rbac.yaml's RoleBinding grants the launcher's Role to.
"""

from __future__ import annotations

import copy
import json
import shlex
import tomllib
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from bot.app import health
from bot.app.config import Config, parse
from bot.app.runtime import STOP_GRACE_S
from bot.cli import build_parser
from bot.slack.serve import WORK_GRACE_S, slack_settings
from tests.deploy.test_dockerfile import exec_form, instructions
from tests.deploy.units import DEPLOY

KUBERNETES = DEPLOY / "kubernetes"
MANIFEST = KUBERNETES / "kvpilot.yaml"
RBAC = KUBERNETES / "rbac.yaml"
NAMESPACE = "kvpilot"
# The newest Kubernetes whose schemas the locked kubernetes-validate bundles, and an older one
# that managed clusters still run: the manifests use nothing newer.
VERSIONS = ("1.37", "1.31")
Object = dict[str, Any]


def documents(path: Path) -> list[Object]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def the(kind: str, path: Path = MANIFEST) -> Object:
    found = [d for d in documents(path) if d["kind"] == kind]
    assert len(found) == 1, f"{path.name}: expected one {kind}, found {len(found)}"
    return found[0]


def pod_spec() -> Object:
    spec: Object = the("Deployment")["spec"]["template"]["spec"]
    return spec


def container() -> Object:
    (only,) = pod_spec()["containers"]
    return dict(only)


def port_number(port: int | str) -> int:
    """A probe's or the Service's port, a named one resolved through the container's ports."""
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in container()["ports"] if p.get("name") == port]
    return int(number)


def mount_for(volume_key: str, name: str) -> Object:
    """The container's mount of the pod volume whose `volume_key` source is named `name`."""
    field = {"configMap": "name", "persistentVolumeClaim": "claimName"}[volume_key]
    (volume,) = [v for v in pod_spec()["volumes"] if v.get(volume_key, {}).get(field) == name]
    return mount_of(volume["name"])


def mount_of(volume: str) -> Object:
    (mount,) = [m for m in container()["volumeMounts"] if m["name"] == volume]
    return dict(mount)


def env_value(name: str) -> str:
    (value,) = [e["value"] for e in container().get("env", []) if e["name"] == name]
    return str(value)


def secret_data() -> dict[str, str]:
    return dict(the("Secret")["stringData"])


def config(monkeypatch: pytest.MonkeyPatch) -> Config:
    """The ConfigMap's kvpilot.toml through kvpilot's parser, at the path the pod reads it
    from, with the Secret's values in the environment (as envFrom gives them)."""
    for key, value in secret_data().items():
        monkeypatch.setenv(key, value)
    text = the("ConfigMap")["data"]["kvpilot.toml"]
    return parse(tomllib.loads(text), Path(env_value("KVPILOT_CONFIG")))


def dockerfile_final_stage(op: str) -> list[str]:
    steps = instructions()
    final = max(s.stage for s in steps)
    return [s.args for s in steps if s.op == op and s.stage == final]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_document_validates_against_the_kubernetes_schemas(version: str) -> None:
    checked: list[str] = []
    for path in sorted(KUBERNETES.glob("*.yaml")):
        for doc in documents(path):
            where = f"{path.name}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            try:
                used = kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{where} at {'.'.join(map(str, exc.path))}: {exc.message}")
            assert used == version, f"{where}: validated against {used}, not {version}"
            checked.append(where)
    assert len(checked) == 9, checked  # rbac.yaml's 3 objects and kvpilot.yaml's 6


@pytest.mark.parametrize(
    ("break_it", "complaint"),
    [
        (lambda d: d["spec"].update(replicas="one"), "'one' is not of type 'integer'"),
        (
            lambda d: d["spec"]["template"]["spec"]["containers"][0].update(healthcheck={}),
            "'healthcheck' was unexpected",
        ),
        (
            lambda d: d["spec"]["template"]["spec"]["containers"][0]["livenessProbe"].update(
                periodSecond=30
            ),
            "'periodSecond' was unexpected",
        ),
    ],
    ids=["replicas-not-a-number", "unknown-container-field", "misspelt-probe-field"],
)
def test_the_schemas_reject_a_broken_deployment(
    break_it: Callable[[Object], None], complaint: str
) -> None:
    broken = copy.deepcopy(the("Deployment"))
    break_it(broken)
    with pytest.raises(kubernetes_validate.ValidationError) as caught:
        kubernetes_validate.validate(broken, VERSIONS[0], strict=True)
    assert complaint in caught.value.message


def test_every_object_is_in_the_kvpilot_namespace_which_the_file_does_not_create() -> None:
    docs = documents(MANIFEST)
    assert [d["kind"] for d in docs] == [
        "ServiceAccount",
        "Secret",
        "ConfigMap",
        "PersistentVolumeClaim",
        "Deployment",
        "Service",
    ]
    assert {d["metadata"]["namespace"] for d in docs} == {NAMESPACE}


def test_one_pod_at_a_time_owns_the_experiments_and_the_database() -> None:
    deployment = the("Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert the("PersistentVolumeClaim")["spec"]["accessModes"] == ["ReadWriteOnce"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"] == {"matchLabels": labels}


def test_the_database_and_the_launcher_state_are_on_the_volume_claim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mount = mount_for("persistentVolumeClaim", the("PersistentVolumeClaim")["metadata"]["name"])
    data = Path(mount["mountPath"])
    assert not mount.get("readOnly", False)
    loaded = config(monkeypatch)
    assert loaded.database.parent == data and loaded.state_dir.is_relative_to(data)
    # the image's volume and working directory, where it keeps them outside Kubernetes too
    assert [exec_form(v) for v in dockerfile_final_stage("VOLUME")] == [[str(data)]]
    assert dockerfile_final_stage("WORKDIR") == [str(data)]


def test_the_configuration_comes_read_only_from_the_configmap() -> None:
    config_map = the("ConfigMap")
    mount = mount_for("configMap", config_map["metadata"]["name"])
    assert mount["readOnly"] is True and "subPath" not in mount
    path = PurePosixPath(env_value("KVPILOT_CONFIG"))
    assert path.parent == PurePosixPath(mount["mountPath"])
    assert list(config_map["data"]) == [path.name]
    # the image's entrypoint (`kvpilot`) is kept; no --config, so KVPILOT_CONFIG decides
    assert "command" not in container()
    ns = build_parser().parse_args(container()["args"])
    assert ns.command == "serve" and ns.config is None


def test_the_configmaps_toml_loads_with_kvpilots_parser_as_a_kubernetes_launcher(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loaded = config(monkeypatch)
    assert loaded.access is not None and loaded.access.approvers and not loaded.deprecations
    assert list(loaded.servers) == ["kimi"]
    server = loaded.servers["kimi"]
    assert server.api_key == secret_data()["SGLANG_API_KEY"]
    # the bot's pod is not the GPU host: the server's memory comes from the configuration
    assert not server.local_host and not server.local_gpus
    assert server.gpu_memory_gib and server.host_ram_gib
    launcher = server.launcher
    assert launcher is not None and launcher.kind == "kubernetes"
    options = launcher.options
    assert options["kubeconfig"] is None  # the pod's ServiceAccount: in-cluster credentials
    role = the("Role", RBAC)
    assert options["namespace"] == role["metadata"]["namespace"]
    names = {n for rule in role["rules"] for n in rule.get("resourceNames", [])}
    assert options["name"] in names
    # one pod by its own DNS name (POD.SERVICE.NAMESPACE.svc...), never a balancing Service
    host = urlsplit(server.url).hostname or ""
    pod, service, namespace = host.split(".")[:3]
    assert options["workload"] == "StatefulSet" and pod == f"{options['name']}-0"
    assert namespace == options["namespace"] and service


def test_tokens_come_only_from_the_secret() -> None:
    secret = the("Secret")
    assert secret["type"] == "Opaque" and "data" not in secret
    values = secret_data()
    assert {"SLACK_BOT_TOKEN", "SLACK_SIGNING_SECRET"} <= set(values)
    assert all("REPLACE-ME" in v for v in values.values()), values
    # the placeholders are in the form the bot checks for: HTTP mode, no app token
    assert not slack_settings(values).socket_mode
    assert container()["envFrom"] == [{"secretRef": {"name": secret["metadata"]["name"]}}]
    for entry in container().get("env", []):  # plain settings, or references to the Secret
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        assert ref is None or ref["name"] == secret["metadata"]["name"], entry
        assert "value" not in entry or not entry["name"].startswith("SLACK_"), entry
        assert "value" not in entry or entry["name"] not in values, entry
    for kind in ("Deployment", "ConfigMap", "Service"):
        text = json.dumps(the(kind))
        assert not any(p in text for p in ("xoxb-", "xoxp-", "xapp-", "REPLACE-ME")), kind
    toml = tomllib.loads(the("ConfigMap")["data"]["kvpilot.toml"])
    for name, server in toml["servers"].items():
        assert "api_key" not in server, name
        assert server.get("api_key_env", "SGLANG_API_KEY") in values, name


def test_the_probes_ask_healthz_on_the_port_the_bot_serves() -> None:
    ns = build_parser().parse_args(container()["args"])
    (exposed,) = dockerfile_final_stage("EXPOSE")
    assert ns.port == int(exposed) == 3000
    for name in ("readinessProbe", "livenessProbe"):
        probe = container()[name]
        assert probe["httpGet"]["path"] == "/healthz", name
        assert port_number(probe["httpGet"]["port"]) == ns.port, name
        # the database check alone may wait this long for SQLite's write lock
        assert probe["timeoutSeconds"] > health.DB_TIMEOUT_S, name
    live = container()["livenessProbe"]
    assert (live["periodSeconds"], live["failureThreshold"]) == (30, 10)  # restart after 5 min
    service = the("Service")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"] == the("Deployment")["spec"]["selector"]["matchLabels"]
    (port,) = service["spec"]["ports"]
    assert port["port"] == 3000 and port_number(port["targetPort"]) == ns.port


def test_a_stop_finishes_within_the_grace_period() -> None:
    grace = pod_spec()["terminationGracePeriodSeconds"]
    assert grace == 40 and grace > STOP_GRACE_S + WORK_GRACE_S


def test_the_pod_runs_as_the_images_user_on_a_read_only_root() -> None:
    pod = pod_spec()["securityContext"]
    (user,) = dockerfile_final_stage("USER")
    uid, gid = (int(part) for part in user.split(":"))
    assert pod["runAsNonRoot"] is True
    assert (pod["runAsUser"], pod["runAsGroup"], pod["fsGroup"]) == (uid, gid, gid)
    own = container()["securityContext"]
    assert own["readOnlyRootFilesystem"] is True
    assert own["allowPrivilegeEscalation"] is False
    assert own["capabilities"] == {"drop": ["ALL"]}
    # what the bot writes outside its database: temporary files and matplotlib's cache
    writable = [
        PurePosixPath(m["mountPath"])
        for m in container()["volumeMounts"]
        if not m.get("readOnly", False)
    ]
    (tmp,) = [v for v in pod_spec()["volumes"] if "emptyDir" in v]
    assert mount_of(tmp["name"])["mountPath"] == "/tmp"
    env = dict(
        item.split("=", 1)
        for args in dockerfile_final_stage("ENV")
        for item in shlex.split(args)
        if "=" in item
    )
    cache = PurePosixPath(env["MPLCONFIGDIR"])
    assert any(cache.is_relative_to(w) for w in writable), (cache, writable)
    resources = container()["resources"]
    assert resources["requests"] == {"cpu": "100m", "memory": "256Mi"}
    assert resources["limits"] == {"memory": "512Mi"}


def test_the_pods_service_account_is_the_one_rbac_yaml_binds_to_the_launchers_role() -> None:
    spec = pod_spec()
    assert spec.get("automountServiceAccountToken", True) is True
    account = the("ServiceAccount")
    assert spec["serviceAccountName"] == account["metadata"]["name"]
    binding = the("RoleBinding", RBAC)
    subject = {
        "kind": "ServiceAccount",
        "name": account["metadata"]["name"],
        "namespace": account["metadata"]["namespace"],
    }
    assert subject in binding["subjects"]
    role = the("Role", RBAC)
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"]


def test_the_image_is_the_bots_own() -> None:
    assert container()["image"] == "kvpilot:latest"
    (entrypoint,) = dockerfile_final_stage("ENTRYPOINT")
    assert exec_form(entrypoint) == ["kvpilot"]
