"""Which engine answers at a server's URL, for a server configured without `engine =`.

Detection asks the server (`playbooks.engines.detect`), which costs a timeout where the server
is down; a report, a status or the sampler over many unreachable servers would otherwise wait
that long for each of them on every command. So the outcome is kept per URL: an engine found
for as long as the process runs (the engine at a URL changes only with a server's launch
command, which is configuration, read at start), a failure for `FAILED_TTL_S`, so a server that
is down costs one timeout a minute, not one per command, and is found within a minute of
answering again. Until then it is read as the default engine's, as before. The clock is
injected (monotonic seconds), so the tests move it instead of sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from playbooks.engines import detect
from playbooks.engines.base import Engine, EngineClient, EngineError

FAILED_TTL_S = 60.0  # how long a failed detection stands before the server is asked again
DETECT_TIMEOUT_S = 2.0  # briefly: a chat command parses its change with it, within Slack's 3 s

Probe = Callable[..., EngineClient]  # detect(url, api_key=..., timeout_s=...)


@dataclass(frozen=True)
class Outcome:
    engine: Engine | None  # None: no engine answered (down, unauthorised, not an engine)
    until: float | None  # monotonic seconds when it is asked again (None: never)


class Detections:
    """The engines found (and not found) at each URL; one per process (`DETECTIONS`)."""

    def __init__(
        self,
        probe: Probe = detect,
        *,
        now: Callable[[], float] = time.monotonic,
        failed_ttl_s: float = FAILED_TTL_S,
    ) -> None:
        self.probe = probe
        self.now = now
        self.failed_ttl_s = failed_ttl_s
        self._found: dict[str, Outcome] = {}
        self._lock = threading.Lock()

    def engine(self, url: str, api_key: str | None = None) -> Engine | None:
        """The engine at `url`, asked only when nothing is known or a failure has expired;
        None when no engine answered (then or within the last `failed_ttl_s`)."""
        key = url.rstrip("/")
        with self._lock:
            known = self._found.get(key)
        if known is not None and (known.until is None or self.now() < known.until):
            return known.engine
        try:
            client = self.probe(url, api_key=api_key, timeout_s=DETECT_TIMEOUT_S)
        except EngineError:
            outcome = Outcome(None, self.now() + self.failed_ttl_s)
        else:
            client.close()
            outcome = Outcome(client.engine, None)
        with self._lock:
            self._found[key] = outcome
        return outcome.engine

    def clear(self) -> None:
        """Forget every outcome (a test's next server may answer at the same URL)."""
        with self._lock:
            self._found.clear()


DETECTIONS = Detections()
