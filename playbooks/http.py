"""The one way kvpilot makes HTTP clients for the servers it reads, and the one retry policy.

Every read-only HTTP source (an engine's API, Prometheus) is built here, so timeouts, the bearer
header and retries agree: only idempotent reads are retried (GETs, and a POST that only reads:
Prometheus' query with a long expression as form data), only on transport errors and on
502/503/504 (a proxy or a server still starting), a few times with a short exponential wait.
Anything that mutates (the Docker Engine API, Kubernetes) is never retried blindly and does not
use `retried_get`.
"""

from __future__ import annotations

import functools
import ssl
import urllib.parse
from collections.abc import Callable, Sequence

import certifi
import httpx
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

RETRYABLE_STATUS = frozenset({502, 503, 504})


class RetryableStatus(Exception):
    """A response worth retrying (a 502/503/504)."""

    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, (httpx.TransportError, RetryableStatus))


def http_retrying(attempts: int = 3, wait: Callable[..., float] | None = None) -> Retrying:
    """Retries on transport errors and retryable statuses, with a short exponential wait."""
    return Retrying(
        retry=retry_if_exception(_retryable),
        stop=stop_after_attempt(attempts),
        wait=wait or wait_exponential(multiplier=0.2, max=2.0),
        reraise=True,
    )


def is_http_url(url: str) -> bool:
    return url.startswith(("http://", "https://"))


DEFAULT_PORTS = {"http": 80, "https": 443}


def normalised_url(url: str) -> str:
    """The one spelling of what reaches a server, so two configurations that name it
    differently agree on it: scheme and host lower-cased, the port written out (80, 443 when
    the URL has none), no credentials, query or trailing slash. The host is not resolved:
    `localhost` and `127.0.0.1` stay two spellings. ValueError for what is no http(s) URL."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
    except ValueError:  # an unclosed IPv6 bracket
        raise ValueError(f"{url!r} is not an http(s) URL such as http://HOST:PORT") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        raise ValueError(f"{url!r} is not an http(s) URL such as http://HOST:PORT")
    try:
        port = parts.port
    except ValueError:  # a port that is no number, or past 65535
        port = 0
    if port == 0:
        raise ValueError(f"{url!r} has no valid port (1-65535)")
    port = port or DEFAULT_PORTS[scheme]
    host = parts.hostname.lower()
    if ":" in host:  # IPv6: written in brackets
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}{parts.path.rstrip('/')}"


def require_http_url(
    url: str, what: str, example: str, error: Callable[[str, str], Exception]
) -> None:
    """Refuses (`error(message, hint)`) a URL that is not http(s), showing the form with an
    example address (`http://127.0.0.1:30000`)."""
    if not is_http_url(url):
        raise error(
            f"invalid {what} URL {url!r}", f"Use the form http://HOST:PORT (for example {example})."
        )


class Reader:
    """A read-only HTTP source (an engine's API, Prometheus): one server's client and the retry
    policy its GETs run under."""

    def __init__(
        self, http: httpx.Client, *, attempts: int = 3, wait: Callable[..., float] | None = None
    ) -> None:
        self.http = http
        self._retry = http_retrying(attempts, wait)

    @property
    def base_url(self) -> str:
        return str(self.http.base_url).rstrip("/")

    def close(self) -> None:
        self.http.close()

    def _retried_get(self, path: str, params: dict[str, str] | None = None) -> httpx.Response:
        return retried_get(self.http, self._retry, path, params)

    def _retried_read_post(self, path: str, data: dict[str, str]) -> httpx.Response:
        return retried_read(self._retry, lambda: self.http.post(path, data=data))


def http_client(
    base_url: str, *, bearer_token: str | None = None, timeout_s: float = 10.0
) -> httpx.Client:
    """A client for one server: its base URL, its bearer token if any, one timeout."""
    headers = {"Authorization": f"Bearer {bearer_token}"} if bearer_token else {}
    return httpx.Client(
        base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s, verify=tls_context()
    )


def retried_get(
    http: httpx.Client,
    retrying: Retrying,
    path: str,
    params: dict[str, str] | None = None,
) -> httpx.Response:
    """GET `path` under the retry policy.

    A retryable status that persists is returned (the caller says what it means); a transport
    error that persists is raised as `httpx.TransportError` for the caller to explain.
    """
    return retried_read(retrying, lambda: http.get(path, params=params))


def retried_read(retrying: Retrying, send: Callable[[], httpx.Response]) -> httpx.Response:
    """`send` (a request that only reads) under the retry policy, as `retried_get`."""

    def once() -> httpx.Response:
        response = send()
        if response.status_code in RETRYABLE_STATUS:
            raise RetryableStatus(response)
        return response

    try:
        response: httpx.Response = retrying(once)
    except RetryableStatus as exc:
        return exc.response
    return response


def answers_ok(url: str, path: str, timeout_s: float = 5.0) -> bool:
    """One readiness probe: does `url` + `path` answer 200 now? (Never retried: callers poll.)"""
    return first_answer_ok(url, (path,), timeout_s)


@functools.cache
def tls_context() -> ssl.SSLContext:
    """One TLS context for the process: building one loads the CA bundle (~50 ms), which a
    probe taken at every experiment step cannot afford each time (httpx's default bundle)."""
    return ssl.create_default_context(cafile=certifi.where())


def first_answer_ok(url: str, paths: Sequence[str], timeout_s: float = 5.0) -> bool:
    """One readiness probe over `paths`, newest first: a 404 means the server predates that
    path, so the next is asked; the first path it has decides (200: ready)."""
    return readiness(url, paths, timeout_s) == "ready"


def readiness(url: str, paths: Sequence[str], timeout_s: float = 5.0) -> str:
    """`first_answer_ok` in three states: "ready"; "starting" (nothing answers yet, or the
    first path the server has says not yet); "absent": something answers HTTP at `url` but
    has none of `paths`, so it is not the engine (a wrong command, or another program on
    the port), and waiting longer cannot help."""
    for path in paths:
        try:
            status = httpx.get(
                url.rstrip("/") + path, timeout=timeout_s, verify=tls_context()
            ).status_code
        except httpx.HTTPError:
            return "starting"
        if status != 404:
            return "ready" if status == 200 else "starting"
    return "absent"
