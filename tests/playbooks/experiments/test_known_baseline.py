"""A stored baseline: every rule failing alone, the longest window, and the same from SQLite."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from itertools import pairwise
from pathlib import Path

import pytest
from sqlite_utils import Database

from playbooks.engines.base import Snapshot
from playbooks.experiments.known_baseline import (
    CandidateWindow,
    Interruption,
    KnownBaseline,
    NoKnownBaseline,
    choose_baseline,
    find_known_baseline,
)
from playbooks.gate import GateSettings
from storage.chat import save_diagnosis
from storage.db import open_db
from storage.metric_samples import add_gap
from storage.samples import Sample, add_samples, replace_monitor_samples
from storage.server_snapshots import record_snapshot

NOW = datetime(2026, 3, 2, 12, 4, tzinfo=UTC).timestamp()
MIN = 60.0
SETTINGS = GateSettings()


def series(
    start: float,
    end: float,
    step: float = 15.0,
    *,
    running: float = 60.0,
    queued: float = 20.0,
    rate: float = 1000.0,
    prompt: float = 500.0,
    output: float = 200.0,
) -> tuple[Snapshot, ...]:
    """Scrapes of a saturated server every `step` in (start, end], its counters growing steadily
    (2 requests/s since 11:00) and its decode rate wobbling by 5%."""
    out: list[Snapshot] = []
    t = end
    while t > start + 1e-9:
        done = 2.0 * (t - (NOW - 3600))
        out.append(
            Snapshot(
                t=t,
                running=running,
                queued=queued,
                decode_rate=rate * (1 + 0.05 * math.sin(t / 40)),
                completed_requests=done,
                prompt_tokens=done * prompt,
                generated_tokens=done * output,
                aborted_requests=0.0,
                preemptions=0.0,
            )
        )
        t -= step
    return tuple(reversed(out))


RECENT = series(NOW - 5 * MIN, NOW)


def sampler(samples: Sequence[Snapshot], step: float = 15.0) -> CandidateWindow:
    return CandidateWindow("the sampler's samples", tuple(samples), step)


def diagnosis(samples: Sequence[Snapshot], ident: int = 7) -> CandidateWindow:
    return CandidateWindow(f"diagnosis {ident}'s measurement", tuple(samples), 5.0, ident)


def choose(
    *windows: CandidateWindow,
    recent: Sequence[Snapshot] = RECENT,
    interruptions: Sequence[Interruption] = (),
    settings: GateSettings = SETTINGS,
) -> KnownBaseline | NoKnownBaseline:
    return choose_baseline(
        windows, now_ts=NOW, settings=settings, recent=recent, interruptions=interruptions
    )


TWENTY = series(NOW - 20 * MIN, NOW)
WITHOUT_MIDDLE = tuple(s for s in TWENTY if not NOW - 8 * MIN < s.t < NOW - 5 * MIN)


@pytest.mark.parametrize(
    ("window", "recent", "interruptions", "settings", "reason"),
    [
        (sampler(series(NOW - 40 * MIN, NOW - 20 * MIN)), RECENT, (), SETTINGS, "20 min old"),
        (
            sampler(TWENTY),
            RECENT,
            (Interruption("restart", NOW - 6 * MIN, NOW - 6 * MIN + 15),),
            SETTINGS,
            "after the server restarted at 11:58 UTC: only 5.0 min",
        ),
        (
            sampler(TWENTY),
            RECENT,
            (Interruption("down", NOW - 9 * MIN, NOW - 8 * MIN),),
            SETTINGS,
            "after the server was down at 11:55 UTC: only 7.2 min",
        ),
        (
            sampler(TWENTY),
            RECENT,
            (Interruption("no_data", NOW - 11 * MIN, NOW - 10 * MIN),),
            SETTINGS,
            "after the sampler was not running at 11:53 UTC: only 9.2 min",
        ),
        (
            sampler(TWENTY),
            RECENT,
            (Interruption("server_start", NOW - 9 * MIN, NOW - 9 * MIN),),
            SETTINGS,
            "after the server started at 11:55 UTC: only 8.2 min",
        ),
        (
            sampler(TWENTY),
            RECENT,
            (Interruption("config_change", NOW - 7 * MIN, NOW - 7 * MIN),),
            SETTINGS,
            "after the configuration changed at 11:57 UTC: only 6.2 min",
        ),
        (
            sampler(TWENTY),
            RECENT,
            (Interruption("down", NOW - MIN, NOW - MIN),),  # down since the window ended
            SETTINGS,
            "after the server was down at 12:03 UTC: fewer than two scrapes",
        ),
        (
            sampler(WITHOUT_MIDDLE),
            RECENT,
            (),
            SETTINGS,
            "after a hole of 180 s between scrapes at 11:56 UTC: only 5.2 min",
        ),
        (sampler(series(NOW - 8 * MIN, NOW)), RECENT, (), SETTINGS, "only 8.0 min of contiguous"),
        (
            sampler(TWENTY),
            RECENT,
            (),
            replace(SETTINGS, min_baseline_batches=50),
            "the baseline has 40 complete batches of 30 s; at least 50 are needed",
        ),
        (sampler(series(NOW - 20 * MIN, NOW, rate=0.0)), RECENT, (), SETTINGS, "rate is zero"),
        (
            sampler(series(NOW - 20 * MIN, NOW, queued=0.0)),
            RECENT,
            (),
            SETTINGS,
            "the stored window was not saturated: the queue was non-empty in only 0%",
        ),
        (
            sampler(TWENTY),
            series(NOW - 5 * MIN, NOW, running=100.0),
            (),
            SETTINGS,
            "averaged 80 in the stored window and 120 in the last 5 min (+50%; limit ±20%)",
        ),
        (
            sampler(TWENTY),
            series(NOW - 5 * MIN, NOW, prompt=800.0),
            (),
            SETTINGS,
            "prompt tokens per completed request went from 500 to 800",
        ),
        (sampler(TWENTY), RECENT[-1:], (), SETTINGS, "fewer than two scrapes in the last 5 min"),
        (
            CandidateWindow("diagnosis 3's measurement", (), 0.0, 3, "it measured other"),
            RECENT,
            (),
            SETTINGS,
            "diagnosis 3's measurement: it measured other",
        ),
    ],
    ids=[
        "stale",
        "restart",
        "down",
        "no-data",
        "server-started",
        "config-changed",
        "down-since",
        "hole",
        "short",
        "few-batches",
        "zero-rate",
        "unsaturated",
        "load-drift",
        "mix-drift",
        "no-recent",
        "missing",
    ],
)
def test_each_rule_refuses_a_window_alone(
    window: CandidateWindow,
    recent: Sequence[Snapshot],
    interruptions: Sequence[Interruption],
    settings: GateSettings,
    reason: str,
) -> None:
    found = choose(window, recent=recent, interruptions=interruptions, settings=settings)
    assert isinstance(found, NoKnownBaseline)
    assert reason in found.reason
    # and without that one rule's cause the sampler's twenty minutes are usable
    assert isinstance(choose(sampler(TWENTY)), KnownBaseline)


def test_a_clean_recent_window_is_the_baseline() -> None:
    found = choose(sampler(TWENTY))
    assert isinstance(found, KnownBaseline)
    assert found.samples == list(TWENTY)
    assert (found.start_ts, found.end_ts) == (TWENTY[0].t, NOW)
    assert found.source == "the sampler's 20 min before 12:04 UTC"


def test_an_interruption_long_ago_leaves_the_stretch_after_it() -> None:
    found = choose(
        sampler(TWENTY), interruptions=(Interruption("restart", NOW - 18 * MIN, NOW - 18 * MIN),)
    )
    assert isinstance(found, KnownBaseline)
    # a warm-up floor (60 s) after the restart is left out, as in a trial
    assert found.start_ts >= NOW - 17 * MIN
    assert found.source.endswith("after the server restarted at 11:46 UTC")


def test_the_longest_window_is_capped_at_thirty_minutes() -> None:
    found = choose(sampler(series(NOW - 45 * MIN, NOW)))
    assert isinstance(found, KnownBaseline)
    assert found.end_ts - found.start_ts + 15 == pytest.approx(30 * MIN)
    assert found.source == "the sampler's 30 min before 12:04 UTC"


def test_the_longer_window_wins() -> None:
    diag = diagnosis(series(NOW - 13 * MIN, NOW - MIN, step=5.0))
    found = choose(sampler(series(NOW - 25 * MIN, NOW)), diag)
    assert isinstance(found, KnownBaseline) and found.source.startswith("the sampler's 25 min")


def test_the_diagnosis_wins_when_the_sampler_is_not_longer() -> None:
    diag = diagnosis(series(NOW - 13 * MIN, NOW - MIN, step=5.0))
    found = choose(sampler(series(NOW - 12 * MIN, NOW - MIN)), diag)
    assert isinstance(found, KnownBaseline)
    assert found.source == "diagnosis 7's measurement (12 min)"
    assert found.samples == list(diag.samples)


def test_the_diagnosis_serves_when_the_sampler_cannot() -> None:
    diag = diagnosis(series(NOW - 13 * MIN, NOW - MIN, step=5.0))
    restart = (Interruption("restart", NOW - 30 * MIN, NOW - 30 * MIN),)
    found = choose(sampler(series(NOW - 40 * MIN, NOW - 20 * MIN)), diag, interruptions=restart)
    assert isinstance(found, KnownBaseline) and found.source.startswith("diagnosis 7's")


def test_when_none_is_usable_every_reason_is_given() -> None:
    found = choose(sampler(series(NOW - 8 * MIN, NOW)), diagnosis(series(NOW - 40, NOW, 5.0)))
    assert isinstance(found, NoKnownBaseline)
    assert found.reason.startswith("the sampler's samples: only 8.0 min")
    assert "; diagnosis 7's measurement: only 0.7 min" in found.reason


def test_denser_scrapes_inside_a_window_are_thinned_to_its_interval() -> None:
    inside = series(NOW - 10 * MIN, NOW - 4 * MIN, step=5.0)
    mixed = sorted(
        [s for s in TWENTY if not NOW - 10 * MIN < s.t <= NOW - 4 * MIN] + list(inside),
        key=lambda s: s.t,
    )
    found = choose(sampler(mixed))
    assert isinstance(found, KnownBaseline)
    assert min(b.t - a.t for a, b in pairwise(found.samples)) >= 11.25


# ------------------------------------------------------------------------- from storage


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = open_db(tmp_path / "kvpilot.db")
    yield database
    database.close()


def monitor(server: str, samples: Sequence[Snapshot]) -> list[Sample]:
    return [
        Sample(server, "monitor", s.t, datetime.fromtimestamp(s.t, UTC), s.to_json())
        for s in samples
    ]


def find(
    db: Database,
    *,
    diagnosis_id: int | None = None,
    server_started_ts: float | None = None,
    config_changed_ts: float | None = None,
    changed_outside_ts: float | None = None,
) -> KnownBaseline | NoKnownBaseline:
    return find_known_baseline(
        db,
        "s",
        now_ts=NOW,
        settings=SETTINGS,
        server_started_ts=server_started_ts,
        config_changed_ts=config_changed_ts,
        diagnosis_id=diagnosis_id,
        changed_outside_ts=changed_outside_ts,
    )


def test_stored_sampler_rows_are_the_baseline(db: Database) -> None:
    add_samples(db, monitor("s", series(NOW - 60 * MIN, NOW)))
    add_samples(db, monitor("other", series(NOW - 20 * MIN, NOW, running=200.0)))
    found = find(db)
    assert isinstance(found, KnownBaseline)
    assert found.source == "the sampler's 30 min before 12:04 UTC"
    assert found.samples[-1] == series(NOW - MIN, NOW)[-1]  # restored as stored, t epoch


def test_stored_gaps_starts_and_changes_cut_the_window(db: Database) -> None:
    add_samples(db, monitor("s", series(NOW - 30 * MIN, NOW)))
    record_snapshot(db, "s", NOW - 40 * MIN, {"mem_fraction_static": 0.85})  # first seen
    assert isinstance(find(db), KnownBaseline)
    add_gap(db, "other", "restart", NOW - 5 * MIN, NOW - 5 * MIN)  # another server's
    assert isinstance(find(db), KnownBaseline)
    found = find(db, server_started_ts=NOW - 26 * MIN, config_changed_ts=NOW - 24 * MIN)
    assert isinstance(found, KnownBaseline) and "configuration changed at 11:40" in found.source
    record_snapshot(db, "s", NOW - 15 * MIN, {"mem_fraction_static": 0.88})
    found = find(db)
    assert isinstance(found, KnownBaseline) and "configuration changed at 11:49" in found.source
    add_gap(db, "s", "down", NOW - 6 * MIN, NOW - 5 * MIN, detail="503")
    found = find(db)
    assert isinstance(found, NoKnownBaseline)
    assert "after the server was down at 11:58 UTC: only 4.2 min" in found.reason


def test_no_scrape_from_before_a_change_made_by_hand_is_the_baseline(db: Database) -> None:
    """kvpilot found the server on arguments someone set by hand: they were set at some moment
    before, so the scrapes before it was found describe another configuration."""
    add_samples(db, monitor("s", series(NOW - 30 * MIN, NOW)))
    assert isinstance(find(db), KnownBaseline)
    found = find(db, changed_outside_ts=NOW - MIN)
    assert isinstance(found, NoKnownBaseline)
    assert found.reason == (
        "the sampler's samples: after the configuration was found changed outside kvpilot at "
        "12:03 UTC: fewer than two scrapes"
    )


def test_a_diagnosis_measurement_is_found_by_its_id(db: Database) -> None:
    add_samples(db, monitor("s", series(NOW - 13 * MIN, NOW - MIN)))
    scrapes = series(NOW - 13 * MIN, NOW - MIN, step=5.0)
    replace_monitor_samples(db, "s", monitor("s", scrapes), scrapes[0].t, scrapes[-1].t)
    ident = save_diagnosis(
        db, "s", {}, created_by="U1", now=datetime.now(UTC), measured=(scrapes[0].t, NOW - MIN)
    )
    found = find(db, diagnosis_id=ident)
    assert isinstance(found, KnownBaseline)
    assert found.source == f"diagnosis {ident}'s measurement (12 min)"
    assert found.samples == list(scrapes)  # the diagnosis's rows alone cover its range
    # once the sampler has scraped on before and after it, its window is longer and wins; it
    # reads the diagnosis's range thinned to the sampler's interval
    add_samples(db, monitor("s", series(NOW - 16 * MIN, NOW - 13 * MIN) + series(NOW - MIN, NOW)))
    found = find(db, diagnosis_id=ident)
    assert isinstance(found, KnownBaseline)
    assert found.source == "the sampler's 16 min before 12:04 UTC"
    assert min(b.t - a.t for a, b in pairwise(found.samples)) >= 11.25


def test_a_diagnosis_that_cannot_serve_says_why(db: Database) -> None:
    other = save_diagnosis(db, "other", {}, created_by="U1", now=datetime.now(UTC))
    unstored = save_diagnosis(db, "s", {}, created_by="U1", now=datetime.now(UTC))
    found = find(db, diagnosis_id=other)
    assert isinstance(found, NoKnownBaseline)
    assert found.reason == (
        "the sampler's samples: none stored; diagnosis 1's measurement: it measured other"
    )
    found = find(db, diagnosis_id=unstored)
    assert isinstance(found, NoKnownBaseline) and "its scrapes were not stored" in found.reason
    found = find(db, diagnosis_id=99)
    assert isinstance(found, NoKnownBaseline) and "no such diagnosis" in found.reason
