"""Each launcher kind's configuration keys, checked, and the launcher built from them.

`[servers.NAME.launcher]` in kvpilot.toml names a `kind`; the keys that kind takes are listed in
KEYS and checked by `options()` (every error names the key and what is expected); `build()` makes
the launcher. The `process` kind's keys (`command`, `env`) are read by the configuration itself.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from playbooks.clock import Clock
from playbooks.engines import default_engine
from playbooks.engines.base import Engine
from playbooks.launchers.common import ManagedLauncher
from playbooks.launchers.docker import DockerLauncher, DockerSpec
from playbooks.launchers.kube_objects import WORKLOADS
from playbooks.launchers.systemd import SystemdLauncher, SystemdSpec

KINDS = ("process", "systemd", "docker", "kubernetes")
COMMON_KEYS = frozenset({"kind", "ready_timeout_s"})
KEYS: dict[str, frozenset[str]] = {
    "process": frozenset({"command", "env", "stop_timeout_s"}),
    "systemd": frozenset({"unit", "scope", "ssh_host", "ssh_options", "sudo", "dropin_dir"}),
    "docker": frozenset({"container", "socket", "stop_timeout_s"}),
    "kubernetes": frozenset(
        {"workload", "name", "namespace", "container", "worker_container", "kubeconfig", "context"}
    ),
}
_UNIT = re.compile(r"^[A-Za-z0-9:_.\\@-]+\.service$")
_CONTAINER = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]+$")  # the Engine API's rule
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class OptionError(ValueError):
    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def allowed_keys(kind: str) -> set[str]:
    return set(COMMON_KEYS | KEYS[kind])


def _string(table: Mapping[str, Any], key: str, default: str | None = None) -> str | None:
    if key not in table:
        return default
    value = table[key]
    if not isinstance(value, str) or not value.strip():
        raise OptionError(key, f"expected a non-empty string, got {value!r}")
    return value


def _required(table: Mapping[str, Any], key: str, example: str) -> str:
    value = _string(table, key)
    if value is None:
        raise OptionError(key, f"required for this kind of launcher, e.g. {key} = {example}")
    return value


def _matching(value: str | None, pattern: re.Pattern[str], key: str, what: str) -> None:
    if value is not None and not pattern.match(value):
        raise OptionError(key, f"{value!r} is not {what}")


def _number(table: Mapping[str, Any], key: str, default: float) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise OptionError(key, f"expected a positive number of seconds, got {value!r}")
    return float(value)


def options(kind: str, table: Mapping[str, Any]) -> dict[str, Any]:
    """The kind's own keys with their defaults (raises OptionError)."""
    if kind == "systemd":
        return _systemd(table)
    if kind == "docker":
        return _docker(table)
    if kind == "kubernetes":
        return _kubernetes(table)
    raise OptionError("kind", f"{kind!r} is not a known launcher; use one of {', '.join(KINDS)}")


def _systemd(table: Mapping[str, Any]) -> dict[str, Any]:
    unit = _required(table, "unit", '"sglang.service"')
    if "." not in unit:
        unit += ".service"
    _matching(unit, _UNIT, "unit", 'a service unit name such as "sglang.service"')
    scope = _string(table, "scope", "system")
    if scope not in ("system", "user"):
        raise OptionError("scope", f'expected "system" or "user", got {scope!r}')
    ssh_host = _string(table, "ssh_host")
    if ssh_host is not None and (ssh_host.startswith("-") or re.search(r"\s", ssh_host)):
        raise OptionError("ssh_host", f'expected a host such as "root@gpu-1", got {ssh_host!r}')
    ssh_options = table.get("ssh_options", [])
    if not isinstance(ssh_options, list) or not all(isinstance(o, str) for o in ssh_options):
        raise OptionError(
            "ssh_options", 'expected a list of strings, e.g. ["-i", "/etc/kvpilot/id_ed25519"]'
        )
    if ssh_options and ssh_host is None:
        raise OptionError("ssh_options", "only used with ssh_host")
    sudo = table.get("sudo", False)
    if not isinstance(sudo, bool):
        raise OptionError("sudo", f"expected true or false, got {sudo!r}")
    dropin_dir = _string(table, "dropin_dir")
    if dropin_dir is not None and not dropin_dir.startswith("/"):
        raise OptionError(
            "dropin_dir", f"expected an absolute path on the unit's host, got {dropin_dir!r}"
        )
    return {
        "unit": unit,
        "scope": scope,
        "ssh_host": ssh_host,
        "ssh_options": list(ssh_options),
        "sudo": sudo,
        "dropin_dir": dropin_dir,
    }


def _docker(table: Mapping[str, Any]) -> dict[str, Any]:
    container = _required(table, "container", '"sglang"')
    _matching(container, _CONTAINER, "container", "a Docker container name")
    return {
        "container": container,
        "socket": _string(table, "socket", "/var/run/docker.sock"),
        "stop_timeout_s": _number(table, "stop_timeout_s", 60.0),
    }


def _kubernetes(table: Mapping[str, Any]) -> dict[str, Any]:
    workload = _required(table, "workload", '"Deployment"')
    if workload not in WORKLOADS:
        raise OptionError(
            "workload", f"{workload!r} is not supported; use one of {', '.join(WORKLOADS)}"
        )
    name = _required(table, "name", '"sglang"')
    _matching(name, _DNS_SUBDOMAIN, "name", "a Kubernetes object name (lower case, digits, -, .)")
    namespace = _string(table, "namespace", "default")
    _matching(namespace, _DNS_LABEL, "namespace", "a Kubernetes namespace name")
    container = _string(table, "container")
    worker = _string(table, "worker_container")
    _matching(container, _DNS_LABEL, "container", "a container name")
    _matching(worker, _DNS_LABEL, "worker_container", "a container name")
    if worker is not None and workload != "LeaderWorkerSet":
        raise OptionError("worker_container", 'only used with workload = "LeaderWorkerSet"')
    return {
        "workload": workload,
        "name": name,
        "namespace": namespace,
        "container": container,
        "worker_container": worker,
        "kubeconfig": _string(table, "kubeconfig"),
        "context": _string(table, "context"),
    }


def _path(value: str | None, base: Path) -> str | None:
    """A local path from the configuration: relative to the configuration file, `~` expanded."""
    if value is None:
        return None
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else base / path)


def build(
    kind: str,
    opts: Mapping[str, Any],
    *,
    url: str,
    ready_timeout_s: float,
    clock: Clock,
    base_dir: Path,
    engine: Engine | None = None,
) -> ManagedLauncher:
    """The launcher for a checked configuration (kinds other than `process`); `engine` is the
    server's, whose readiness path and exit signatures the launcher reads (default SGLang)."""
    engine = engine or default_engine()
    if kind == "systemd":
        return SystemdLauncher(
            SystemdSpec(
                unit=opts["unit"],
                url=url,
                scope=opts["scope"],
                ssh_host=opts["ssh_host"],
                ssh_options=list(opts["ssh_options"]),
                sudo=opts["sudo"],
                dropin_dir=opts["dropin_dir"],
                ready_timeout_s=ready_timeout_s,
                engine=engine,
            ),
            clock,
        )
    if kind == "docker":
        return DockerLauncher(
            DockerSpec(
                container=opts["container"],
                url=url,
                socket=_path(opts["socket"], base_dir) or "/var/run/docker.sock",
                ready_timeout_s=ready_timeout_s,
                stop_timeout_s=opts["stop_timeout_s"],
                engine=engine,
            ),
            clock,
        )
    if kind == "kubernetes":
        # The Kubernetes client is loaded only for servers that need it.
        from playbooks.launchers.kubernetes import (  # noqa: PLC0415
            KubernetesLauncher,
            KubernetesSpec,
        )

        return KubernetesLauncher(
            KubernetesSpec(
                workload=opts["workload"],
                name=opts["name"],
                url=url,
                namespace=opts["namespace"],
                container=opts["container"],
                worker_container=opts["worker_container"],
                kubeconfig=_path(opts["kubeconfig"], base_dir),
                context=opts["context"],
                ready_timeout_s=ready_timeout_s,
                engine=engine,
            ),
            clock,
        )
    raise ValueError(f"no launcher of kind {kind!r}")
