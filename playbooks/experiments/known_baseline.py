"""A baseline from what is already known: stored scrapes instead of a fresh 10-minute window.

The sampler stores every server's full snapshot each tick, and `kvpilot diagnose` stores the
scrapes of its measurement, both as `monitor` samples (`storage.samples`, `t` in epoch seconds).
An experiment approved minutes later can take such a window as its baseline instead of measuring
one, provided the window says what a measured baseline would have said: it is recent, nothing
restarted or changed the server inside it, its scrapes are contiguous, it is long enough for the
gate's noise estimate, and it passes the gate's own validity checks (saturation, and no drift of
the load or the request mix against the last minutes). `choose_baseline` decides that over typed
windows (pure); `find_known_baseline` reads them from storage.

A stored window may be longer than a measured one (up to `MAX_WINDOW_S`): a longer baseline
narrows the effect's interval, so the trial needs fewer batches to decide.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import pairwise

from sqlite_utils import Database

from playbooks.engines import restore_snapshot
from playbooks.engines.base import Snapshot
from playbooks.gate.checks import drift, unsaturated
from playbooks.gate.settings import GateSettings
from playbooks.gate.windows import read_baseline, window_facts
from playbooks.stats.batch_means import scrape_spacing
from storage import chat as diagnoses
from storage.errors import NotFound
from storage.metric_samples import gaps_between
from storage.samples import monitor_samples
from storage.server_snapshots import changes_between

# A measured baseline's oldest scrape is `baseline_s` (10 min by default) older than the restart
# that follows it. A stored window ending up to 15 min ago keeps the time between the baseline
# and the trial of the same order (at most 1.5 measured baselines more), and the drift checks
# against the last minutes catch a load that moved in between; older windows are refused.
DEFAULT_MAX_AGE_S = 900.0
# The longest stored window used: three measured baselines; older scrapes add little precision
# and more chance that the load drifted within the window.
MAX_WINDOW_S = 1800.0
# "Now" for the drift checks: the last 5 minutes of monitor samples (20 of the sampler's 15 s
# scrapes, several 30 s batches), long enough for a mean in flight that is not one scrape's.
RECENT_S = 300.0
# A hole longer than this many scrape intervals breaks a window (the sampler's own rule for
# contiguous samples, `bot/reports/sampler.py` CONTIGUOUS_FACTOR).
HOLE_FACTOR = 2.5
# Thinning keeps a scrape once this share of the window's interval has passed since the last
# kept one: a diagnosis's 5 s scrapes inside the sampler's 15 s series become one per 15 s.
THIN_FRACTION = 0.75


@dataclass(frozen=True)
class Interruption:
    """Something after which earlier scrapes no longer describe the server: a sampler gap
    (`down`, `restart`, `no_data`), the server started, or its configuration changed (by
    kvpilot, or found changed by hand: `changed_outside`, at the time kvpilot found it)."""

    kind: str
    start_ts: float
    end_ts: float

    def describe(self) -> str:
        what = {
            "down": "the server was down",
            "restart": "the server restarted",
            "no_data": "the sampler was not running",
            "server_start": "the server started",
            "config_change": "the configuration changed",
            "changed_outside": "the configuration was found changed outside kvpilot",
        }.get(self.kind, self.kind)
        return f"{what} at {_clock_time(self.start_ts)}"


@dataclass(frozen=True)
class CandidateWindow:
    """Stored scrapes that might serve as the baseline (`t` epoch seconds, oldest first)."""

    name: str  # for people: "the sampler's samples", "diagnosis 7's measurement"
    samples: tuple[Snapshot, ...]
    scrape_s: float  # the interval they were scraped at
    diagnosis_id: int | None = None
    missing: str = ""  # why there are no samples, when there are none


@dataclass(frozen=True)
class KnownBaseline:
    """A usable stored window: its restored samples and where they came from."""

    samples: list[Snapshot]  # restored, .t = epoch seconds, oldest first
    start_ts: float
    end_ts: float
    source: str  # for people: "the sampler's 30 min before 12:04 UTC"


@dataclass(frozen=True)
class NoKnownBaseline:
    """No stored window was usable; the reason goes into the verdict ("measured: ...")."""

    reason: str


def _clock_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%H:%M UTC")


def thin(samples: Sequence[Snapshot], scrape_s: float) -> list[Snapshot]:
    """One scrape per `scrape_s`: denser runs (a diagnosis's) would weigh more in the window's
    per-scrape means (load, queue share) and mix bin widths in its noise estimate."""
    kept: list[Snapshot] = []
    for s in samples:
        if not kept or s.t - kept[-1].t >= THIN_FRACTION * scrape_s:
            kept.append(s)
    return kept


def _covered_s(samples: Sequence[Snapshot]) -> float:
    """The time a window stands for: each scrape stands for the interval ending with it."""
    return samples[-1].t - samples[0].t + scrape_spacing(samples)


def _last_break(
    samples: Sequence[Snapshot],
    scrape_s: float,
    interruptions: Sequence[Interruption],
    now_ts: float,
    settle_s: float,
) -> tuple[float, str] | None:
    """(where the usable part starts, why) after the latest interruption or hole, if any.

    A window starts `settle_s` (the gate's warm-up floor) after an interruption, as a trial
    does after its restart: a server just started or restarted is still warming up."""
    first = samples[0].t
    cut: tuple[float, str] | None = None
    for i in interruptions:
        start = i.end_ts + settle_s
        if start > first and i.start_ts <= now_ts and (cut is None or start > cut[0]):
            cut = (start, i.describe())
    for a, b in pairwise(samples):
        if b.t - a.t > HOLE_FACTOR * scrape_s and (cut is None or b.t > cut[0]):
            cut = (b.t, f"a hole of {b.t - a.t:.0f} s between scrapes at {_clock_time(a.t)}")
    return cut


def _capped(samples: Sequence[Snapshot], max_window_s: float) -> list[Snapshot]:
    """The newest part covering at most `max_window_s`."""
    spacing = scrape_spacing(samples)
    return [s for s in samples if s.t >= samples[-1].t - max_window_s + spacing - 1e-9]


def _validity(
    samples: Sequence[Snapshot], recent: Sequence[Snapshot], settings: GateSettings
) -> str | None:
    """The gate's own checks on a baseline: batches and noise, saturation, drift against now."""
    try:
        base = read_baseline(samples, settings)
    except ValueError as exc:
        return str(exc)
    found = unsaturated("stored window", base.facts, settings)
    if found is not None:
        return found
    if len(recent) < 2:
        return f"fewer than two scrapes in the last {RECENT_S / 60:g} min to compare it with"
    now = window_facts(recent, recent[0].t)
    # The mix is compared once enough requests completed recently, as the gate compares it
    # once its rate window is ready (`playbooks/gate/windows.py` rate_window).
    mix = now if (now.completed or 0) >= settings.min_requests_for_rates else None
    names = ("the stored window", f"the last {RECENT_S / 60:g} min")
    drifted = drift(base.facts, now, mix, settings, names=names)
    return "; ".join(drifted) if drifted else None


def _source(window: CandidateWindow, samples: Sequence[Snapshot], since: str) -> str:
    minutes = f"{_covered_s(samples) / 60:.0f} min"
    after = f", after {since}" if since else ""
    if window.diagnosis_id is not None:
        return f"diagnosis {window.diagnosis_id}'s measurement ({minutes}{after})"
    return f"the sampler's {minutes} before {_clock_time(samples[-1].t)}{after}"


@dataclass(frozen=True)
class _Now:
    """What every window is judged against."""

    now_ts: float
    settings: GateSettings
    recent: Sequence[Snapshot]
    interruptions: Sequence[Interruption]
    max_age_s: float
    max_window_s: float


def _judge(window: CandidateWindow, at: _Now) -> KnownBaseline | NoKnownBaseline:
    """One window's verdict, each failing rule with its own reason. The part after the latest
    interruption or hole is what is judged, so the longest clean stretch ending last is used."""
    samples = thin(window.samples, window.scrape_s)
    if len(samples) < 2:
        return NoKnownBaseline(window.missing or "fewer than two stored scrapes")
    age = at.now_ts - samples[-1].t
    if age > at.max_age_s:
        return NoKnownBaseline(
            f"its newest scrape is {age / 60:.0f} min old (at most {at.max_age_s / 60:g} min)"
        )
    since = ""
    settle = at.settings.warmup_floor_s
    cut = _last_break(samples, window.scrape_s, at.interruptions, at.now_ts, settle)
    if cut is not None:
        samples = [s for s in samples if s.t >= cut[0]]
        since = cut[1]
    prefix = f"after {since}: " if since else ""
    if len(samples) < 2:
        return NoKnownBaseline(f"{prefix}fewer than two scrapes")
    samples = _capped(samples, at.max_window_s)
    covered = _covered_s(samples)
    if covered < at.settings.baseline_s - 1e-9:
        return NoKnownBaseline(
            f"{prefix}only {covered / 60:.1f} min of contiguous scrapes "
            f"(a baseline needs {at.settings.baseline_s / 60:g} min)"
        )
    invalid = _validity(samples, at.recent, at.settings)
    if invalid is not None:
        return NoKnownBaseline(prefix + invalid)
    return KnownBaseline(samples, samples[0].t, samples[-1].t, _source(window, samples, since))


def choose_baseline(
    windows: Sequence[CandidateWindow],
    *,
    now_ts: float,
    settings: GateSettings,
    recent: Sequence[Snapshot],
    interruptions: Sequence[Interruption] = (),
    max_age_s: float = DEFAULT_MAX_AGE_S,
    max_window_s: float = MAX_WINDOW_S,
) -> KnownBaseline | NoKnownBaseline:
    """The longest usable window; a diagnosis's wins unless another is longer by more than a
    scrape (it was measured for this decision, at the gate's own scrape interval).

    `recent` is the last minutes of scrapes (the drift checks' "now"), `interruptions` what
    happened to the server (sampler gaps, its start, configuration changes)."""
    at = _Now(now_ts, settings, recent, interruptions, max_age_s, max_window_s)
    usable: list[tuple[float, KnownBaseline]] = []
    reasons: list[str] = []
    for w in windows:
        verdict = _judge(w, at)
        if isinstance(verdict, NoKnownBaseline):
            reasons.append(f"{w.name}: {verdict.reason}")
            continue
        bonus = w.scrape_s if w.diagnosis_id is not None else 0.0
        usable.append((_covered_s(verdict.samples) + bonus, verdict))
    if usable:
        return max(usable, key=lambda pair: pair[0])[1]
    return NoKnownBaseline("; ".join(reasons) or "no stored scrapes")


# ------------------------------------------------------------------------- from storage


def _restored(db: Database, server: str, since: float, until: float) -> tuple[Snapshot, ...]:
    return tuple(
        restore_snapshot(r.metrics, float(r.t)) for r in monitor_samples(db, server, since, until)
    )


def _spacing_outside(
    samples: Sequence[Snapshot], ranges: Sequence[diagnoses.MeasuredRange]
) -> float:
    """The sampler's interval: the median spacing of scrapes outside every diagnosis's range
    (those are the diagnosis's, denser); of all of them when none lies outside."""

    def inside(s: Snapshot) -> bool:
        return any(r.start_ts <= s.t <= r.end_ts for r in ranges)

    steps = [b.t - a.t for a, b in pairwise(samples) if not inside(a) and not inside(b)]
    return statistics.median(steps) if steps else scrape_spacing(samples)


def _diagnosis_window(db: Database, server: str, diagnosis_id: int) -> CandidateWindow:
    name = f"diagnosis {diagnosis_id}'s measurement"
    try:
        row = diagnoses.get_diagnosis(db, diagnosis_id)
    except NotFound:
        return CandidateWindow(name, (), 0.0, diagnosis_id, "no such diagnosis")
    if row.server != server:
        return CandidateWindow(name, (), 0.0, diagnosis_id, f"it measured {row.server}")
    if row.measured_from is None or row.measured_until is None:
        return CandidateWindow(name, (), 0.0, diagnosis_id, "its scrapes were not stored")
    samples = _restored(db, server, row.measured_from, row.measured_until)
    missing = "its scrapes are past the monitor retention"
    return CandidateWindow(name, samples, scrape_spacing(samples), diagnosis_id, missing)


def _interruptions(
    db: Database,
    server: str,
    since: float,
    until: float,
    server_started_ts: float | None,
    config_changed_ts: float | None,
    changed_outside_ts: float | None = None,
) -> list[Interruption]:
    found = [
        Interruption(g.kind, g.start_ts, g.end_ts) for g in gaps_between(db, server, since, until)
    ]
    found += [
        Interruption("config_change", c.ts, c.ts) for c in changes_between(db, server, since, until)
    ]
    for kind, ts in (
        ("server_start", server_started_ts),
        ("config_change", config_changed_ts),
        ("changed_outside", changed_outside_ts),
    ):
        if ts is not None:
            found.append(Interruption(kind, ts, ts))
    return found


def find_known_baseline(
    db: Database,
    server: str,
    *,
    now_ts: float,
    settings: GateSettings,
    server_started_ts: float | None,
    config_changed_ts: float | None,
    diagnosis_id: int | None,
    changed_outside_ts: float | None = None,
) -> KnownBaseline | NoKnownBaseline:
    """The stored baseline an experiment on `server` can use now, or why there is none.

    Reads the monitor samples of the last `DEFAULT_MAX_AGE_S + MAX_WINDOW_S`, the sampler's
    gaps, settings changes the sampler saw, and the diagnosis's measured range; the engine gives
    the server's start and the time its configuration was applied (epoch seconds), or the time
    kvpilot found it changed by hand (`changed_outside_ts`: the change was made at some moment
    before, so no scrape before it is used)."""
    since = now_ts - DEFAULT_MAX_AGE_S - MAX_WINDOW_S
    stored = _restored(db, server, since, now_ts)
    ranges = diagnoses.measured_ranges(db, server, since, now_ts)
    windows = [
        CandidateWindow(
            "the sampler's samples", stored, _spacing_outside(stored, ranges), missing="none stored"
        )
    ]
    if diagnosis_id is not None:
        windows.append(_diagnosis_window(db, server, diagnosis_id))
    return choose_baseline(
        windows,
        now_ts=now_ts,
        settings=settings,
        recent=[s for s in stored if s.t >= now_ts - RECENT_S],
        interruptions=_interruptions(
            db, server, since, now_ts, server_started_ts, config_changed_ts, changed_outside_ts
        ),
    )
