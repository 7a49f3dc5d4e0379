"""Samples, roll-ups and retention: the report reads the same numbers from any level."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlite_utils import Database

from playbooks.reports.throughput import build_report, choose_level
from storage.db import open_db
from storage.metric_buckets import Bucket, RawSample, group, regroup, usage_bin
from storage.metric_samples import (
    Retention,
    add_gap,
    add_samples,
    compact,
    gaps_between,
    oldest,
    rollups_between,
    samples_between,
)
from tests.bot.reports.synthetic import DAY, generate

START = datetime(2026, 3, 2, 0, 0, tzinfo=UTC).timestamp()


@pytest.fixture
def db(tmp_path: Path) -> Database:
    return open_db(tmp_path / "kvpilot.db")


def sample(ts: float, **values: float) -> RawSample:
    return RawSample(server="s", ts=ts, span_s=15.0, dt=15.0, **values)  # type: ignore[arg-type]


def test_bucket_weights_gauges_by_time_and_counts_only_contiguous_tokens() -> None:
    b = Bucket(start_ts=0, bucket_s=300)
    b.add(sample(15, gen_tokens=1500, decode_rate=100, queued=0, running=10, token_usage=0.5))
    b.add(sample(30, gen_tokens=3000, decode_rate=300, queued=4, running=30, token_usage=0.95))
    b.add(RawSample("s", 45, 15.0, None, gen_tokens=600, queued=2, running=20))  # after a gap
    assert b.samples == 3 and b.span_s == 45 and b.timed_s == 30
    assert b.gen_tokens == 5100 and b.gen_tokens_timed == 4500
    assert b.effective_rate() == 150.0  # 4,500 tokens over the 30 s observed contiguously
    assert b.mean("decode_rate") == 200.0  # the third sample had no reading: not a zero
    assert b.mean("queue") == 2.0 and b.queue_max == 4 and b.saturated_s == 30
    assert b.mean("usage") == pytest.approx(0.725)
    assert b.usage_hist == {50: 15.0, 95: 15.0}
    assert usage_bin(1.0) == 99 and usage_bin(0.0) == 0 and usage_bin(1.3) == 99


def test_regrouping_is_exact() -> None:
    samples = [
        sample(START + 15 * i, gen_tokens=i, decode_rate=i % 7, queued=i % 3)
        for i in range(1, 1000)
    ]
    fine = group(samples, 300)
    hourly = regroup(fine, 3600)
    direct = group(samples, 3600)
    assert [h.start_ts for h in hourly] == [d.start_ts for d in direct]
    for h, d in zip(hourly, direct, strict=True):
        assert h.gen_tokens == d.gen_tokens and h.samples == d.samples
        assert (
            h.decode_rate_sum == pytest.approx(d.decode_rate_sum) and h.saturated_s == d.saturated_s
        )
        assert h.decode_rate_max == d.decode_rate_max
    # the peak effective rate is a 5-minute figure at every level
    assert max(b.eff_peak or 0 for b in hourly) == max(b.eff_peak or 0 for b in fine)


def test_compaction_rolls_up_complete_buckets_and_expires_each_level(db: Database) -> None:
    retention = Retention(raw_s=DAY, five_minute_s=3 * DAY, hourly_s=6 * DAY)
    generate(db, "s", START, 8, interval_s=60, retention=retention)
    add_gap(db, "s", "down", START + 10, START + 20)
    end = START + 8 * DAY
    levels = oldest(db, "s")
    # raw samples for the last day, 5-minute buckets for 3 days, hourly for 6 (+ settling)
    assert end - levels[0] == pytest.approx(DAY, abs=120)
    assert end - levels[300] == pytest.approx(3 * DAY, abs=600)
    assert end - levels[3600] == pytest.approx(6 * DAY, abs=3600)
    # nothing older than a level's retention, and every complete bucket rolled up once
    fives = rollups_between(db, "s", 300, end - 3 * DAY, end)
    assert len({b.start_ts for b in fives}) == len(fives)
    assert all(b.start_ts % 300 == 0 for b in fives)
    assert fives[-1].end_ts >= end - 600
    compact(db, end + 3600, retention)
    again = compact(db, end + 3600, retention)  # idempotent: nothing new to do
    assert again.rolled_up == {300: 0, 3600: 0}
    # old closed gaps go with the longest level
    assert gaps_between(db, "s", 0, end) == []


def test_the_report_is_the_same_from_raw_samples_and_from_roll_ups(tmp_path: Path) -> None:
    raw_db = open_db(tmp_path / "raw.db")
    rolled_db = open_db(tmp_path / "rolled.db")
    since, until = START + DAY, START + 3 * DAY
    for d in (raw_db, rolled_db):
        generate(d, "s", START, 4, interval_s=30, restart_at=START + 1.5 * DAY)
    compact(rolled_db, START + 4 * DAY, Retention(raw_s=12 * 3600, five_minute_s=4 * DAY))
    w = {
        "since": datetime.fromtimestamp(since, UTC),
        "until": datetime.fromtimestamp(until, UTC),
    }
    a = build_report(raw_db, "s", **w)  # type: ignore[arg-type]
    b = build_report(rolled_db, "s", **w)  # type: ignore[arg-type]
    assert a.resolution_s == 0 and b.resolution_s == 300
    assert a.tokens_generated == b.tokens_generated and a.requests_completed == b.requests_completed
    assert a.generation.mean == pytest.approx(b.generation.mean)
    assert a.generation.peak == b.generation.peak
    assert a.effective.mean == pytest.approx(b.effective.mean)
    assert a.effective.peak == pytest.approx(b.effective.peak)
    assert a.saturated_s == b.saturated_s and a.observed_s == b.observed_s
    assert a.usage == b.usage
    assert a.restarts == b.restarts == 1 and a.downtime_s == b.downtime_s == 480
    assert [p.decode_rate for p in a.series] == pytest.approx(
        [p.decode_rate for p in b.series], nan_ok=True
    )


def test_report_totals_match_what_happened(db: Database) -> None:
    truth = generate(
        db, "s", START, 2, interval_s=15, restart_at=START + 0.5 * DAY, restart_down_s=1800
    )
    report = build_report(
        db,
        "s",
        since=datetime.fromtimestamp(START, UTC),
        until=datetime.fromtimestamp(START + 2 * DAY, UTC),
    )
    assert report.tokens_generated == round(truth.gen_tokens)
    assert report.requests_completed == round(truth.requests)
    assert report.saturated_s == truth.saturated_s and report.observed_s == truth.span_s
    assert report.generation.peak == truth.decode_rate_max
    assert report.restarts == truth.restarts == 1 and report.downtime_s == truth.down_s
    # percentiles from the 1% histogram are within a bin of the exact ones
    exact = sorted(truth.usages)
    assert report.usage is not None
    for p, got in ((0.5, report.usage.p50), (0.9, report.usage.p90), (0.99, report.usage.p99)):
        assert abs(got - exact[int(p * (len(exact) - 1))]) <= 0.011
    assert report.usage.max == max(exact)
    # two days: a point per 15 minutes; nights are idle, the restart is a hole
    assert report.series_step_s == 900 and len(report.series) == 2 * 96
    for restart_point in report.series[48:50]:  # 12:00-12:30 on day one: down
        assert restart_point.decode_rate is None and restart_point.queue is None
    noon = report.series[47]  # 11:45-12:00: busy
    assert noon.queue and noon.queue > 80 and noon.decode_rate and noon.decode_rate > 600
    night = report.series[10]
    assert night.queue == 0 and night.decode_rate == 0


def test_level_choice() -> None:
    assert choose_level({}, 100.0) == 0
    assert choose_level({0: 50.0, 300: 40.0}, 100.0) == 0
    assert choose_level({0: 1000.0, 300: 90.0, 3600: 0.0}, 100.0) == 300
    assert choose_level({0: 1000.0, 300: 900.0, 3600: 0.0}, 100.0) == 3600
    # nothing reaches back: the level that reaches furthest, the finest on a tie
    assert choose_level({0: 1000.0, 300: 1000.0}, 100.0) == 0


def test_samples_between_is_half_open(db: Database) -> None:
    add_samples(db, [sample(START + i) for i in range(10)])
    got = samples_between(db, "s", START + 2, START + 5)
    assert [s.ts - START for s in got] == [2, 3, 4]
    assert not math.isnan(got[0].span_s)
    assert timedelta(seconds=got[0].span_s) == timedelta(seconds=15)
