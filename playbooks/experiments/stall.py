"""A server that answers but has stopped generating: every reading stays the same.

A stuck scheduler (a hung collective, a wedged GPU) leaves an engine's HTTP server up: its
readiness answers yes and its metrics answer with the values of the last batch it ran, its
decode rate among them where the engine exports the rate as a gauge set by the scheduler (see
`playbooks.engines.sglang.metrics`). The rate therefore cannot show the stall; that nothing at
all moves can. A server with requests in hand changes some reading with every batch (a gauge
at each stats log, a counter at each finished request), so readings that stay the
same for `GateSettings.stall_limit_s` while requests run or wait mean nothing is generated.

Frozen readings are a strong sign, not proof: an idle server's gauges can keep the last batch's
values (SGLang 0.5.23 publishes its idle values within 30 s, older releases at their next
batch). So before anything is said or undone, the server is asked for one token
(`generates`): a server that answers is idle or working, and the readings' clock starts again;
one that does not answer within `PROBE_S` is stuck.

The measuring states keep two progress keys for this, updated with every stored scrape:
`reading`, a digest of the newest reading, and `moved_ts`, when the readings last changed (or
last showed no work, which cannot be stuck, or last answered the probe).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from playbooks.clock import Clock
from playbooks.engines.base import EngineClient, EngineError, Prompt, Snapshot
from playbooks.experiments.progress import Progress

KEYS = ("reading", "moved_ts")
# How long a one-token request may take before the server counts as not generating, on the
# server's time line (SGLang's own generating health check waits 20 s); at least PROBE_FLOOR_S
# of wall time against an accelerated twin, so a loaded test machine is not read as a stall.
PROBE_S = 30.0
PROBE_FLOOR_S = 5.0
PROBE = Prompt(text="Say OK.")


def digest(snapshot: Snapshot) -> str | None:
    """The reading in a few bytes, or None when it cannot show a stall: no requests in hand
    (an idle server reads the same all day) or no counters (a load reading without them)."""
    if snapshot.running + snapshot.queued <= 0 or not snapshot.has_counters:
        return None
    text = json.dumps(snapshot.to_json(), sort_keys=True, default=str)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def progress_after(progress: Progress, snapshot: Snapshot, now_ts: float) -> dict[str, Any]:
    """The stall keys after storing `snapshot` at `now_ts`: unchanged while it reads as before."""
    seen = digest(snapshot)
    if seen is not None and seen == progress.reading and progress.moved_ts is not None:
        return {}
    return {"reading": seen, "moved_ts": now_ts}


def still_for_s(progress: Progress) -> float:
    """How long the stored readings of this state have stayed the same with work in hand."""
    moved, last = progress.moved_ts, progress.last_ts
    if moved is None or last is None or progress.reading is None:
        return 0.0
    return max(0.0, float(last) - float(moved))


def carried(progress: Progress) -> dict[str, Any]:
    """The stall keys to carry into the next measuring state (warm-up into the trial)."""
    return {k: getattr(progress, k) for k in KEYS if getattr(progress, k) is not None}


def generates(client: EngineClient, clock: Clock) -> bool:
    """Whether the server answers a one-token request in time (the greedy answer to a short
    prompt: one request's load, nothing changed)."""
    timeout = max(clock.wall_seconds(PROBE_S), PROBE_FLOOR_S)
    try:
        client.generate(PROBE, max_tokens=1, timeout_s=timeout)
    except EngineError:
        return False
    return True
