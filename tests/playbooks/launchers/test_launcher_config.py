"""`[servers.NAME.launcher]` for each kind: what is accepted, what each mistake says, and the
launcher the wiring builds from it."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.app.config import ConfigError, load
from bot.app.wiring import launcher
from playbooks.clock import WallClock
from playbooks.launchers.docker import DockerLauncher
from playbooks.launchers.kubernetes import KubernetesLauncher
from playbooks.launchers.process import ProcessLauncher
from playbooks.launchers.systemd import SystemdLauncher

SERVER = '[servers.a]\nurl = "http://127.0.0.1:30000"\n[servers.a.launcher]\n'


def parse(tmp_path: Path, launcher_table: str) -> object:
    path = tmp_path / "kvpilot.toml"
    path.write_text(SERVER + launcher_table)
    config = load(str(path))
    return launcher(config, config.server("a"), WallClock())


def test_each_kind_builds_its_launcher(tmp_path: Path) -> None:
    built = parse(tmp_path, 'kind = "systemd"\nunit = "sglang"\nssh_host = "root@gpu-1"\n')
    assert isinstance(built, SystemdLauncher)
    assert built.spec.unit == "sglang.service" and built.spec.scope == "system"
    assert built.spec.ssh_host == "root@gpu-1" and built.spec.ready_timeout_s == 1800

    built = parse(tmp_path, 'kind = "docker"\ncontainer = "sglang"\nready_timeout_s = 600\n')
    assert isinstance(built, DockerLauncher)
    assert built.spec.socket == "/var/run/docker.sock" and built.spec.ready_timeout_s == 600

    built = parse(
        tmp_path,
        'kind = "kubernetes"\nworkload = "LeaderWorkerSet"\nname = "kimi"\n'
        'namespace = "llm"\ncontainer = "leader"\nworker_container = "worker"\n'
        'kubeconfig = "kube/config"\ncontext = "gpu-cluster"\n',
    )
    assert isinstance(built, KubernetesLauncher)
    assert built.spec.kubeconfig == str(tmp_path / "kube/config")  # relative to the file
    assert (built.spec.workload, built.spec.namespace, built.spec.worker_container) == (
        "LeaderWorkerSet",
        "llm",
        "worker",
    )

    built = parse(tmp_path, 'kind = "process"\ncommand = ["python", "-m", "x", "--port", "1"]\n')
    assert isinstance(built, ProcessLauncher)
    assert built.spec.stop_timeout_s == 30 and built.spec.engine.name == "sglang"


def test_the_launcher_reads_the_servers_engine_and_its_stop_timeout(tmp_path: Path) -> None:
    """A vLLM server's launcher waits on vLLM's readiness path and reads vLLM's exits."""
    server = '[servers.a]\nurl = "http://127.0.0.1:8000"\nengine = "vllm"\n[servers.a.launcher]\n'
    path = tmp_path / "kvpilot.toml"
    for table, kind in [
        (
            'kind = "process"\ncommand = ["vllm", "serve", "m"]\nstop_timeout_s = 5\n',
            ProcessLauncher,
        ),
        ('kind = "docker"\ncontainer = "vllm-0"\n', DockerLauncher),
        ('kind = "systemd"\nunit = "vllm"\n', SystemdLauncher),
    ]:
        path.write_text(server + table)
        config = load(str(path))
        built = launcher(config, config.server("a"), WallClock())
        assert isinstance(built, kind)
        assert built.spec.engine.name == "vllm", kind
        if isinstance(built, ProcessLauncher):
            assert built.spec.stop_timeout_s == 5


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            'kind = "nomad"\n',
            "launcher.kind: 'nomad' is not a known launcher; use one of \"process\"",
        ),
        ('kind = "systemd"\n', "launcher.unit: required for this kind of launcher"),
        (
            'kind = "systemd"\nunit = "sglang.socket"\n',
            "launcher.unit: 'sglang.socket' is not a service",
        ),
        (
            'kind = "systemd"\nunit = "s"\nscope = "global"\n',
            'launcher.scope: expected "system" or "user"',
        ),
        (
            'kind = "systemd"\nunit = "s"\nssh_host = "-oProxyCommand=sh"\n',
            "launcher.ssh_host: expected a host",
        ),
        (
            'kind = "systemd"\nunit = "s"\nssh_options = ["-v"]\n',
            "launcher.ssh_options: only used with ssh_host",
        ),
        (
            'kind = "systemd"\nunit = "s"\ndropin_dir = "etc"\n',
            "launcher.dropin_dir: expected an absolute",
        ),
        ('kind = "systemd"\nunit = "s"\ncommand = ["x"]\n', "launcher: unknown key(s) command"),
        ('kind = "docker"\n', "launcher.container: required"),
        (
            'kind = "docker"\ncontainer = "a b"\n',
            "launcher.container: 'a b' is not a Docker container",
        ),
        (
            'kind = "docker"\ncontainer = "cc"\nstop_timeout_s = 0\n',
            "launcher.stop_timeout_s: expected a positive",
        ),
        ('kind = "kubernetes"\nname = "x"\n', "launcher.workload: required"),
        (
            'kind = "kubernetes"\nworkload = "DaemonSet"\nname = "x"\n',
            "launcher.workload: 'DaemonSet' is not supported; use one of Deployment",
        ),
        (
            'kind = "kubernetes"\nworkload = "Deployment"\nname = "Big_Name"\n',
            "launcher.name: 'Big_Name' is not",
        ),
        (
            'kind = "kubernetes"\nworkload = "Deployment"\nname = "x"\nworker_container = "w"\n',
            'launcher.worker_container: only used with workload = "LeaderWorkerSet"',
        ),
        (
            'kind = "kubernetes"\nworkload = "Deployment"\nname = "x"\nsocket = "/s"\n',
            "launcher: unknown key(s) socket",
        ),
    ],
)
def test_mistakes_name_the_key(tmp_path: Path, table: str, message: str) -> None:
    path = tmp_path / "kvpilot.toml"
    path.write_text(SERVER + table)
    with pytest.raises(ConfigError) as exc:
        load(str(path))
    assert f"servers.a.{message}" in str(exc.value), str(exc.value)
