"""SGLang's router (sgl-router, now sgl-model-gateway): its worker-management HTTP API.

SGLang's router (sgl-router, PyPI `sglang-router`; since renamed sgl-model-gateway): its
worker-management HTTP API, in the two dialects operators run.

Read from the released sources (the PyPI sdists of `sglang-router`):

- 0.1.x, `src/server.rs`:201-203: `POST /add_worker?url=`, `POST /remove_worker?url=`,
  `GET /list_workers` -> `{"urls": [...]}` (handlers at 114-155). `add_worker` waits until the
  worker answers its health check and says 200, or 400 with the router's text, e.g.
  `Worker URL already exists` (`src/routers/router.rs`:764); `remove_worker` always says 200.
- 0.2.x, `src/server.rs`:681-684: `POST /workers` with `{"url": ...}`, `GET /workers`,
  `GET|DELETE /workers/{url}`; adding and removing are queued jobs answered 202 (449-497,
  564-589) and done in the background; a listed worker's `id` is its URL
  (`src/core/worker.rs`:1133-1134).
- 0.3.x, `src/server.rs`:635-639 and `src/core/worker_service.rs`: the same routes, but a
  worker's `id` is a UUID (`create_worker` 225, 202 with the id; `delete_worker` 314 takes only
  the id and answers 400 for anything else, `parse_worker_id` 209); control-plane routes take
  the router's API key as a bearer token (`src/middleware.rs`:112-128).

So kvpilot lists `GET /workers` and deletes by the listed `id` (the URL in 0.2, the UUID in
0.3); a router that answers 404 there is 0.1's, asked on its older routes. A queued job is
done once the worker is (or is no longer) listed, which the drain checks before it waits for
the server's running requests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import quote

import httpx

from playbooks.http import http_client, http_retrying, retried_get
from playbooks.routers.base import RouterError, same_url

Dialect = Literal["workers", "legacy"]


class SGLangRouter:
    kind = "sglang"

    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self._http = http_client(self.url, bearer_token=api_key, timeout_s=timeout_s)
        self._retrying = http_retrying()
        self._dialect: Dialect | None = None

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------ reads
    def dialect(self) -> Dialect:
        """`workers` (0.2 and later) or `legacy` (0.1), asked once."""
        if self._dialect is None:
            answer = self._get("/workers")
            if answer.status_code in (401, 403):
                self._ok(answer, "listing its workers")  # says which key to set
            if answer.status_code == 200:
                self._dialect = "workers"
            elif answer.status_code == 404 and self._get("/list_workers").status_code == 200:
                self._dialect = "legacy"
            else:
                raise RouterError(
                    f"{self.url} answered neither GET /workers nor GET /list_workers (HTTP "
                    f"{answer.status_code}): is it an SGLang router? Check [groups.NAME.router] "
                    "url"
                )
        return self._dialect

    def workers(self) -> list[dict[str, Any]]:
        """The workers the router routes to: `url` and `id` each (`id` is the URL in 0.1)."""
        if self.dialect() == "legacy":
            urls = self._json(self._get("/list_workers"), "GET /list_workers").get("urls", [])
            return [{"url": str(u), "id": str(u)} for u in urls]
        listed = self._json(self._get("/workers"), "GET /workers").get("workers", [])
        return [
            {"url": str(w.get("url", "")), "id": str(w.get("id") or w.get("url", ""))}
            for w in listed
            if isinstance(w, dict)
        ]

    def listed(self, worker: str) -> bool:
        return self._find(worker) is not None

    def entry(self, worker: str) -> dict[str, Any]:
        return {}  # the URL is all SGLang's router needs to add a worker

    # ------------------------------------------------------------------ writes
    def remove(self, worker: str) -> str:
        found = self._find(worker)
        if found is None:
            return f"{worker} is not in the rotation of {self.url}: nothing to remove"
        if self.dialect() == "legacy":
            answer = self._post("/remove_worker", params={"url": found["url"]})
        else:
            answer = self._call("DELETE", f"/workers/{quote(found['id'], safe='')}")
            if answer.status_code == 404:  # removed meanwhile
                return f"{worker} left {self.url} meanwhile"
        self._ok(answer, f"removing {worker}")
        return f"asked {self.url} to remove {worker} (HTTP {answer.status_code})"

    def add(self, worker: str, entry: Mapping[str, Any]) -> str:
        if self._find(worker) is not None:
            return f"{worker} is in the rotation of {self.url} already"
        if self.dialect() == "legacy":
            answer = self._post("/add_worker", params={"url": worker})
        else:
            answer = self._call("POST", "/workers", json={"url": worker})
        if answer.status_code == 400 and "already exists" in answer.text:
            return f"{worker} is in the rotation of {self.url} already"
        self._ok(answer, f"adding {worker}")
        return f"asked {self.url} to add {worker} (HTTP {answer.status_code})"

    # ------------------------------------------------------------------ plumbing
    def _find(self, worker: str) -> dict[str, Any] | None:
        return next((w for w in self.workers() if same_url(w["url"], worker)), None)

    def _get(self, path: str) -> httpx.Response:
        try:
            return retried_get(self._http, self._retrying, path)
        except httpx.TransportError as exc:
            raise RouterError(f"cannot reach the SGLang router at {self.url}: {exc}") from None

    def _post(self, path: str, *, params: dict[str, str]) -> httpx.Response:
        return self._call("POST", path, params=params)

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One write, never retried blindly: the caller lists again and decides."""
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise RouterError(f"cannot reach the SGLang router at {self.url}: {exc}") from None

    def _ok(self, answer: httpx.Response, what: str) -> None:
        if answer.status_code in (200, 201, 202, 204):
            return
        hint = (
            " (the router wants its API key: set [groups.NAME.router] api_key_env)"
            if answer.status_code in (401, 403)
            else ""
        )
        raise RouterError(
            f"the SGLang router at {self.url} refused {what}: HTTP {answer.status_code} "
            f"{answer.text[:200]}{hint}"
        )

    def _json(self, answer: httpx.Response, what: str) -> dict[str, Any]:
        self._ok(answer, what)
        try:
            data = answer.json()
        except ValueError:
            raise RouterError(f"{what} on {self.url} did not answer JSON") from None
        if not isinstance(data, dict):
            raise RouterError(f"{what} on {self.url} answered {type(data).__name__}, not an object")
        return data
