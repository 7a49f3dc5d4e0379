"""The decode rate the gate judges: a counter's increase where the engine counts decode tokens.

SGLang's `gen_throughput` gauge is the rate over the last `decode_log_interval` decode steps
(40 by default) before a scrape, so on a prefill-heavy load one reading can fall on a run of
prefills and the next on pure decoding: on the twin's multi-turn and long-prompt scenarios the
30 s means of 5 s readings of it varied 11-25% from one batch to the next, enough to revert
changes worth +6%. SGLang 0.5.23 also counts every decode step's tokens
(`realtime_tokens_total{mode="decode"}`, `Snapshot.decoded_tokens`); its increase between two
scrapes is the rate over the whole interval, every step in it counted once. Where two
consecutive readings carry that count, the later one's decode rate is that increase per second;
a reading keeps its own gauge where the one before has no count, the count went back (the
server restarted in between) or the two are less than `MIN_SPAN_S` apart (a scrape's own
duration would then be a large part of the interval). Applying it twice changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from playbooks.engines.base import Snapshot

MIN_SPAN_S = 1.0


def counted(samples: Sequence[Snapshot]) -> list[Snapshot]:
    """The samples, each decode rate taken from the decode count where the engine keeps one."""
    out = list(samples)
    for i in range(1, len(out)):
        rate = _counted_rate(samples[i - 1], samples[i])
        if rate is not None and rate != out[i].decode_rate:
            out[i] = replace(out[i], decode_rate=rate)
    return out


def _counted_rate(before: Snapshot, after: Snapshot) -> float | None:
    a, b = before.decoded_tokens, after.decoded_tokens
    span = after.t - before.t
    if a is None or b is None or b < a or span < MIN_SPAN_S:
        return None
    return (b - a) / span
