"""The decode rate the gate judges: a counter's increase where the engine counts decode tokens.

SGLang's `gen_throughput` gauge is the rate over the last `decode_log_interval` decode steps
(40 by default) before a scrape, so on a prefill-heavy load one reading can fall on a run of
prefills and the next on pure decoding: on the twin's multi-turn and long-prompt scenarios the
30 s means of 5 s readings of it varied 11-25% from one batch to the next, enough to revert
changes worth +6%. SGLang 0.5.23 also counts every decode step's tokens
(`realtime_tokens_total{mode="decode"}`, `Snapshot.decoded_tokens`); its increase between two
scrapes is the rate over the whole interval, every step in it counted once. Where two
consecutive readings carry that count, the later one's decode rate is that increase per second.
A reading keeps its own gauge where the one before has no count, the server restarted in between
(its other counters went back too), the two are less than `MIN_SPAN_S` apart (a scrape's own
duration would then be a large part of the interval) or more than `HOLE_FACTOR` times the
window's usual spacing (samples were left out between them). A count below the last good one
without a restart (a rank's series missing from one reading) is not used, and the next reading
is measured from the last good one. Applying it twice changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from itertools import pairwise

from playbooks.engines.base import Snapshot

MIN_SPAN_S = 1.0
# A reading further from the one before than this many times the window's usual spacing spans
# samples left out of the window (a peer out of rotation, a hole in the scrapes): the count's
# rate over it would bring the left-out time back in, so the reading keeps its gauge.
HOLE_FACTOR = 2.5
# Counters besides the decode count that start again with the server's process.
_PROCESS_COUNTERS = ("generated_tokens", "prompt_tokens", "completed_requests")


def counted(samples: Sequence[Snapshot]) -> list[Snapshot]:
    """The samples, each decode rate taken from the decode count where the engine keeps one."""
    out = list(samples)
    spacings = sorted(b.t - a.t for a, b in pairwise(samples))
    hole = HOLE_FACTOR * spacings[len(spacings) // 2] if spacings else 0.0
    ref: Snapshot | None = None  # the last reading whose count can be trusted
    for i, x in enumerate(samples):
        count = x.decoded_tokens
        if count is None:
            ref = None
            continue
        if ref is not None and ref.decoded_tokens is not None and count < ref.decoded_tokens:
            if _restarted(ref, x):
                ref = x  # a new process: its count starts again (this reading keeps its gauge)
            continue  # a reading below the last good one (a rank's series missing): not used
        if ref is not None and ref.decoded_tokens is not None:
            span = x.t - ref.t
            if MIN_SPAN_S <= span <= hole:
                rate = (count - ref.decoded_tokens) / span
                if rate != x.decode_rate:
                    out[i] = replace(x, decode_rate=rate)
        ref = x
    return out


def _restarted(before: Snapshot, after: Snapshot) -> bool:
    """Whether the process started again between the readings: another of its counters went
    back too, or none is there to say otherwise."""
    pairs = [
        (getattr(before, name), getattr(after, name))
        for name in _PROCESS_COUNTERS
        if getattr(before, name) is not None and getattr(after, name) is not None
    ]
    return not pairs or any(b < a for a, b in pairs)
