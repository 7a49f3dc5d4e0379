"""vLLM's production-stack router: backends added and removed in its dynamic config file.

vLLM's production-stack router (`vllm-project/production-stack`, `src/vllm_router`): it has no
HTTP API to add or remove a backend, so kvpilot edits its dynamic configuration file.

Read from its source (commit a6c01db05f65, August 2026):

- The routes (`routers/main_router.py`:51-271) serve requests, models, engines and health;
  none adds or removes a backend.
- Backends come from service discovery: `static` (`--static-backends` URLs with
  `--static-models` by position: `service_discovery.py`:221-243, the two lists must have the same
  length) or `k8s` (pods by label selector, taken into and out of rotation by their readiness,
  terminating pods dropped: `service_discovery.py`:486-494, 692-716).
- `--dynamic-config-json` / `--dynamic-config-yaml` (`parsers/parser.py`:341-350) starts a
  watcher (`app.py`:258-268, every 10 s) that reloads the file when it differs from the running
  configuration and rebuilds service discovery from it (`dynamic_config.py`:162-188, 263-287).
  The file's keys are `DynamicRouterConfig`'s fields (`dynamic_config.py`:43-67); an unknown key
  makes the reload fail and the router keep its old configuration (`from_json`/`from_yaml`:
  110-119), so kvpilot changes only the backend lists and keeps every other key as it was.
- Its health route answers the configuration the watcher last applied
  (`routers/main_router.py`:212-247), which is how kvpilot sees a change take effect.

So with static discovery a server leaves the rotation when its URL (and the model, label and type
at the same position) leaves the file's lists and the router's health route shows the reloaded
lists; it returns the same way. With k8s discovery the router already follows pod readiness, so
kvpilot has nothing to do and says so (`RouterError`).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import yaml

from playbooks.http import http_client, http_retrying, retried_get
from playbooks.routers.base import RouterError, same_url

# The comma-separated lists that go by position with `static_backends`.
ALIGNED = ("static_models", "static_model_labels", "static_model_types")


def split(text: Any) -> list[str]:
    return [] if not text else [part for part in str(text).split(",") if part]


def without(config: Mapping[str, Any], worker: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The configuration with `worker` out of the backend lists, and its entry (what went with
    it by position, to add it back). Unchanged when it is not listed (pure)."""
    out = dict(config)
    backends = split(config.get("static_backends"))
    index = next((i for i, url in enumerate(backends) if same_url(url, worker)), None)
    if index is None:
        return out, {}
    entry: dict[str, Any] = {"index": index}
    out["static_backends"] = ",".join(backends[:index] + backends[index + 1 :])
    for key in ALIGNED:
        values = split(config.get(key))
        if len(values) == len(backends):
            entry[key] = values[index]
            out[key] = ",".join(values[:index] + values[index + 1 :])
    return out, entry


def with_worker(config: Mapping[str, Any], worker: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration with `worker` back at its position, with what went with it (pure)."""
    out = dict(config)
    backends = split(config.get("static_backends"))
    if any(same_url(url, worker) for url in backends):
        return out
    if "static_models" not in entry:  # static discovery pairs every URL with a model
        raise RouterError(
            f"kvpilot does not know which model {worker} serves (its entry was not recorded "
            "when it was taken out): add it back to the router's static_backends and "
            "static_models by hand"
        )
    index = min(int(entry.get("index", len(backends))), len(backends))
    for key in ALIGNED:
        values = split(config.get(key))
        if key in entry and len(values) == len(backends):
            out[key] = ",".join([*values[:index], str(entry[key]), *values[index:]])
    out["static_backends"] = ",".join([*backends[:index], worker, *backends[index:]])
    return out


class VllmStackRouter:
    kind = "vllm_stack"

    def __init__(self, url: str, config_file: str, *, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.config_file = Path(config_file)
        # the router's own routes are asked relative to its base URL
        self._http = http_client(self.url + "/", timeout_s=timeout_s)
        self._retrying = http_retrying()

    def close(self) -> None:
        self._http.close()

    def running_config(self) -> dict[str, Any]:
        """The configuration the router applied last, from its health route."""
        try:
            answer = retried_get(self._http, self._retrying, "health")
        except httpx.TransportError as exc:
            raise RouterError(f"cannot reach the vLLM router at {self.url}: {exc}") from None
        try:
            data = answer.json()
        except ValueError:
            data = {}
        config = data.get("dynamic_config") if isinstance(data, dict) else None
        if not isinstance(config, dict):
            raise RouterError(
                f"the vLLM router at {self.url} reports no dynamic configuration (HTTP "
                f"{answer.status_code}): start it with --dynamic-config-json "
                f"{self.config_file} so kvpilot can take servers out of its rotation"
            )
        return config

    def listed(self, worker: str) -> bool:
        running = self.running_config()
        self._static(running)
        return any(same_url(u, worker) for u in split(running.get("static_backends")))

    def entry(self, worker: str) -> dict[str, Any]:
        return without(self._read(), worker)[1]

    def remove(self, worker: str) -> str:
        config = self._read()
        changed, entry = without(config, worker)
        if not entry:
            return f"{worker} is not in {self.config_file}: nothing to remove"
        self._write(changed)
        return f"removed {worker} from {self.config_file}; the router reloads it within 10 s"

    def add(self, worker: str, entry: Mapping[str, Any]) -> str:
        config = self._read()
        changed = with_worker(config, worker, entry)
        if changed == config:
            return f"{worker} is in {self.config_file} already"
        self._write(changed)
        return f"added {worker} back to {self.config_file}; the router reloads it within 10 s"

    # ------------------------------------------------------------------ the file
    def _static(self, config: Mapping[str, Any]) -> None:
        if config.get("service_discovery") != "static":
            raise RouterError(
                f"the vLLM router at {self.url} discovers its backends by "
                f"{config.get('service_discovery')!r}, not from a static list: with Kubernetes "
                "discovery it already takes a pod out of rotation while the pod is not ready, "
                "so kvpilot cannot and need not drain it; remove [groups.NAME.router]"
            )

    def _read(self) -> dict[str, Any]:
        try:
            text = self.config_file.read_text()
        except OSError as exc:
            raise RouterError(
                f"cannot read the vLLM router's dynamic configuration {self.config_file}: "
                f"{exc.strerror} (kvpilot must run where it can edit that file)"
            ) from None
        try:
            data = yaml.safe_load(text) if self._yaml else json.loads(text)
        except (ValueError, yaml.YAMLError) as exc:
            raise RouterError(f"{self.config_file} is not valid: {exc}") from None
        if not isinstance(data, dict):
            raise RouterError(f"{self.config_file}: expected a mapping of the router's options")
        self._static(data)
        return data

    @property
    def _yaml(self) -> bool:
        return self.config_file.suffix in (".yaml", ".yml")

    def _write(self, config: Mapping[str, Any]) -> None:
        """Replace the file in one rename, so the watcher never reads half of it."""
        text = (
            yaml.safe_dump(dict(config), sort_keys=False)
            if self._yaml
            else json.dumps(config, indent=2) + "\n"
        )
        folder = self.config_file.parent
        fd, tmp = tempfile.mkstemp(prefix=".kvpilot-", dir=folder)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(text)
            os.chmod(tmp, self.config_file.stat().st_mode & 0o777)
            os.replace(tmp, self.config_file)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            raise RouterError(f"cannot write {self.config_file}: {exc.strerror}") from None
