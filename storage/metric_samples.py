"""Sampled server metrics over time: raw scrapes, gaps, and roll-ups that keep a year small.

A raw sample is one scrape of a server. It keeps the counters as read and their *increases*
since the previous scrape, worked out when the sample is written: a counter that went down
means the server restarted, and (as Prometheus' ``increase()`` does) the new value is then the
increase. ``dt`` is the time since the previous sample when the two are contiguous, and
``None`` after any gap, so that rates are only ever computed over time that was observed.

Time without data is a gap row, never a run of zeros: ``down`` (scrapes failed), ``restart``
(counters reset between two good scrapes) and ``no_data`` (the sampler was not running).

``compact`` sums raw samples into 5-minute buckets and those into 1-hour buckets (the same
``Bucket`` arithmetic for both), then deletes what is older than each level's retention.
Buckets keep sums, maxima and a 1%-wide histogram of KV token usage, so totals, means, peaks
and percentiles can be read from any level without the raw rows.

All times are seconds since the Unix epoch (UTC) as floats.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

from sqlite_utils import Database

from storage.db import write_transaction
from storage.metric_buckets import (
    FIVE_MINUTES,
    ONE_HOUR,
    Bucket,
    RawSample,
    bucket_start,
    group,
    regroup,
)

ROLLUP_SIZES: tuple[int, ...] = (FIVE_MINUTES, ONE_HOUR)

GapKind = Literal["down", "restart", "no_data"]
GAP_KINDS: tuple[GapKind, ...] = ("down", "restart", "no_data")

_RAW_COLUMNS = tuple(f.name for f in fields(RawSample))


@dataclass(frozen=True)
class Gap:
    """Time without data for a server. ``open`` while the server is still down."""

    id: int
    server: str
    kind: GapKind
    start_ts: float
    end_ts: float
    open: bool
    restarted: bool
    detail: str

    def overlap(self, since: float, until: float) -> float:
        """Seconds of this gap inside [since, until)."""
        return max(0.0, min(self.end_ts, until) - max(self.start_ts, since))


# ----------------------------------------------------------------------------- raw samples
def add_sample(db: Database, sample: RawSample) -> None:
    """Store one raw sample."""
    marks = ", ".join("?" for _ in _RAW_COLUMNS)
    with write_transaction(db):
        db.execute(
            f"INSERT INTO metric_samples ({', '.join(_RAW_COLUMNS)}) VALUES ({marks})",
            [getattr(sample, c) for c in _RAW_COLUMNS],
        )


def add_samples(db: Database, samples: Sequence[RawSample]) -> int:
    """Store many raw samples in one transaction (imports, benchmarks)."""
    marks = ", ".join("?" for _ in _RAW_COLUMNS)
    with write_transaction(db):
        db.conn.executemany(
            f"INSERT INTO metric_samples ({', '.join(_RAW_COLUMNS)}) VALUES ({marks})",
            [[getattr(s, c) for c in _RAW_COLUMNS] for s in samples],
        )
    return len(samples)


def last_sample(db: Database, server: str) -> RawSample | None:
    """The newest raw sample of ``server``."""
    rows = list(
        db.query("SELECT * FROM metric_samples WHERE server = ? ORDER BY ts DESC LIMIT 1", [server])
    )
    return RawSample(**rows[0]) if rows else None


def newest_sample_ts(db: Database) -> float | None:
    """When the newest raw sample of any server was taken (epoch seconds), if there is one:
    a scaled clock starts after it, so a restarted bot never writes time backwards."""
    newest = db.execute("SELECT MAX(ts) FROM metric_samples").fetchone()[0]
    return None if newest is None else float(newest)


def samples_between(db: Database, server: str, since: float, until: float) -> list[RawSample]:
    """Raw samples with ``since <= ts < until``, oldest first."""
    cursor = db.execute(
        f"SELECT {', '.join(_RAW_COLUMNS)} FROM metric_samples"
        " WHERE server = ? AND ts >= ? AND ts < ? ORDER BY ts",
        [server, since, until],
    )
    return [RawSample(*row) for row in cursor.fetchall()]


def sampled_servers(db: Database) -> list[str]:
    """Every server with samples at any level."""
    rows = db.execute(
        "SELECT server FROM metric_samples UNION SELECT server FROM metric_rollups ORDER BY 1"
    ).fetchall()
    return [r[0] for r in rows]


# ----------------------------------------------------------------------------- gaps
def _gap(row: dict[str, Any]) -> Gap:
    return Gap(
        id=row["id"],
        server=row["server"],
        kind=row["kind"],
        start_ts=row["start_ts"],
        end_ts=row["end_ts"],
        open=bool(row["open"]),
        restarted=bool(row["restarted"]),
        detail=row["detail"],
    )


def add_gap(
    db: Database,
    server: str,
    kind: GapKind,
    start_ts: float,
    end_ts: float,
    *,
    open: bool = False,
    restarted: bool = False,
    detail: str = "",
) -> int:
    """Record a gap; returns its id."""
    if kind not in GAP_KINDS:
        raise ValueError(f"unknown gap kind {kind!r}; one of {', '.join(GAP_KINDS)}")
    if end_ts < start_ts:
        raise ValueError(f"a gap cannot end ({end_ts}) before it starts ({start_ts})")
    with write_transaction(db):
        cursor = db.execute(
            "INSERT INTO metric_gaps (server, kind, start_ts, end_ts, open, restarted, detail)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            [server, kind, start_ts, end_ts, int(open), int(restarted), detail],
        )
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def extend_gap(db: Database, gap_id: int, end_ts: float, detail: str | None = None) -> None:
    """Move an open gap's end to ``end_ts`` (another failed scrape)."""
    with write_transaction(db):
        if detail is None:
            db.execute("UPDATE metric_gaps SET end_ts = ? WHERE id = ?", [end_ts, gap_id])
        else:
            db.execute(
                "UPDATE metric_gaps SET end_ts = ?, detail = ? WHERE id = ?",
                [end_ts, detail, gap_id],
            )


def close_gap(db: Database, gap_id: int, end_ts: float, *, restarted: bool) -> None:
    """End an open gap at the first good scrape after it."""
    with write_transaction(db):
        db.execute(
            "UPDATE metric_gaps SET end_ts = ?, open = 0, restarted = ? WHERE id = ?",
            [end_ts, int(restarted), gap_id],
        )


def open_gap(db: Database, server: str) -> Gap | None:
    """The server's open gap, if it is (as far as the sampler knows) still down."""
    rows = list(
        db.query(
            "SELECT * FROM metric_gaps WHERE server = ? AND open = 1 ORDER BY id DESC LIMIT 1",
            [server],
        )
    )
    return _gap(rows[0]) if rows else None


def gaps_between(db: Database, server: str, since: float, until: float) -> list[Gap]:
    """Gaps that overlap [since, until), oldest first."""
    rows = db.query(
        "SELECT * FROM metric_gaps WHERE server = ? AND end_ts >= ? AND start_ts < ?"
        " ORDER BY start_ts, id",
        [server, since, until],
    )
    return [_gap(row) for row in rows]


# ----------------------------------------------------------------------------- roll-ups
_ROLLUP_COLUMNS = (
    "server",
    "bucket_s",
    "start_ts",
    "samples",
    "span_s",
    "timed_s",
    "gen_tokens",
    "gen_tokens_timed",
    "prompt_tokens",
    "requests",
    "retractions",
    "decode_rate_sum",
    "decode_rate_span",
    "decode_rate_max",
    "running_sum",
    "running_max",
    "queue_sum",
    "queue_max",
    "saturated_s",
    "usage_sum",
    "usage_span",
    "usage_max",
    "usage_hist_json",
    "retract_seen",
    "eff_peak",
    "max_total_tokens",
)


def _rollup_values(server: str, b: Bucket) -> list[Any]:
    hist = json.dumps({str(k): round(v, 3) for k, v in sorted(b.usage_hist.items())})
    values: dict[str, Any] = {
        "server": server,
        "bucket_s": int(b.bucket_s),
        "usage_hist_json": hist,
    }
    return [values[c] if c in values else getattr(b, c) for c in _ROLLUP_COLUMNS]


def _rollup(row: Sequence[Any]) -> Bucket:
    data = dict(zip(_ROLLUP_COLUMNS, row, strict=True))
    hist = {int(k): float(v) for k, v in json.loads(data.pop("usage_hist_json")).items()}
    data.pop("server")
    return Bucket(usage_hist=hist, **data)


def add_rollups(db: Database, server: str, buckets: Sequence[Bucket]) -> None:
    """Store buckets (replacing any with the same server, size and start)."""
    marks = ", ".join("?" for _ in _ROLLUP_COLUMNS)
    with write_transaction(db):
        db.conn.executemany(
            f"INSERT OR REPLACE INTO metric_rollups ({', '.join(_ROLLUP_COLUMNS)})"
            f" VALUES ({marks})",
            [_rollup_values(server, b) for b in buckets],
        )


def rollups_between(
    db: Database, server: str, bucket_s: int, since: float, until: float
) -> list[Bucket]:
    """Stored buckets of one size that start in [since, until), oldest first."""
    cursor = db.execute(
        f"SELECT {', '.join(_ROLLUP_COLUMNS)} FROM metric_rollups"
        " WHERE server = ? AND bucket_s = ? AND start_ts >= ? AND start_ts < ?"
        " ORDER BY start_ts",
        [server, bucket_s, since, until],
    )
    return [_rollup(row) for row in cursor.fetchall()]


def oldest(db: Database, server: str) -> dict[int, float]:
    """The oldest time held at each level: 0 for raw samples, else the bucket size."""
    out: dict[int, float] = {}
    raw = db.execute("SELECT MIN(ts) FROM metric_samples WHERE server = ?", [server]).fetchone()
    if raw[0] is not None:
        out[0] = float(raw[0])
    for size, first in db.execute(
        "SELECT bucket_s, MIN(start_ts) FROM metric_rollups WHERE server = ? GROUP BY bucket_s",
        [server],
    ).fetchall():
        out[int(size)] = float(first)
    return out


@dataclass(frozen=True)
class Retention:
    """How long each level is kept, in seconds."""

    raw_s: float = 3 * 86400
    five_minute_s: float = 35 * 86400
    hourly_s: float = 400 * 86400

    def __post_init__(self) -> None:
        if self.raw_s < 2 * FIVE_MINUTES:
            raise ValueError("raw samples must be kept at least 10 minutes to be rolled up")
        if self.five_minute_s < self.raw_s:
            raise ValueError("5-minute roll-ups must be kept at least as long as raw samples")
        if self.hourly_s < self.five_minute_s:
            raise ValueError("1-hour roll-ups must be kept at least as long as 5-minute ones")


@dataclass(frozen=True)
class CompactionResult:
    rolled_up: dict[int, int]  # bucket size -> buckets written
    deleted: dict[str, int]  # level -> rows deleted


def _watermark(db: Database, server: str, size: int) -> float | None:
    row = db.execute(
        "SELECT MAX(start_ts) FROM metric_rollups WHERE server = ? AND bucket_s = ?",
        [server, size],
    ).fetchone()
    return None if row[0] is None else float(row[0]) + size


def _roll_up_server(db: Database, server: str, now: float, settle_s: float) -> dict[int, int]:
    written = dict.fromkeys(ROLLUP_SIZES, 0)
    # 5-minute buckets from raw samples
    start = _watermark(db, server, FIVE_MINUTES)
    if start is None:
        first = db.execute("SELECT MIN(ts) FROM metric_samples WHERE server = ?", [server])
        first_ts = first.fetchone()[0]
        start = None if first_ts is None else bucket_start(float(first_ts), FIVE_MINUTES)
    end = bucket_start(now - settle_s, FIVE_MINUTES)
    if start is not None and end > start:
        buckets = group(samples_between(db, server, start, end), FIVE_MINUTES)
        add_rollups(db, server, buckets)
        written[FIVE_MINUTES] = len(buckets)
    # 1-hour buckets from 5-minute ones
    start = _watermark(db, server, ONE_HOUR)
    if start is None:
        first = db.execute(
            "SELECT MIN(start_ts) FROM metric_rollups WHERE server = ? AND bucket_s = ?",
            [server, FIVE_MINUTES],
        ).fetchone()[0]
        start = None if first is None else bucket_start(float(first), ONE_HOUR)
    end = bucket_start(now - settle_s, ONE_HOUR)
    if start is not None and end > start:
        hours = regroup(rollups_between(db, server, FIVE_MINUTES, start, end), ONE_HOUR)
        add_rollups(db, server, hours)
        written[ONE_HOUR] = len(hours)
    return written


def compact(
    db: Database, now: float, retention: Retention = Retention(), settle_s: float = 60.0
) -> CompactionResult:
    """Roll up complete buckets and delete what is past retention; cheap to run often.

    A bucket is rolled up once ``settle_s`` has passed after its end (no sample can still
    arrive for it). Each level is built from the one below, so nothing is lost when raw rows
    go. Gaps are kept as long as the longest level.
    """
    rolled = dict.fromkeys(ROLLUP_SIZES, 0)
    for server in sampled_servers(db):
        for size, count in _roll_up_server(db, server, now, settle_s).items():
            rolled[size] += count
    deleted: dict[str, int] = {}
    with write_transaction(db):
        deleted["raw"] = db.execute(
            "DELETE FROM metric_samples WHERE ts < ?", [now - retention.raw_s]
        ).rowcount
        deleted["5m"] = db.execute(
            "DELETE FROM metric_rollups WHERE bucket_s = ? AND start_ts < ?",
            [FIVE_MINUTES, now - retention.five_minute_s],
        ).rowcount
        deleted["1h"] = db.execute(
            "DELETE FROM metric_rollups WHERE bucket_s = ? AND start_ts < ?",
            [ONE_HOUR, now - retention.hourly_s],
        ).rowcount
        deleted["gaps"] = db.execute(
            "DELETE FROM metric_gaps WHERE open = 0 AND end_ts < ?", [now - retention.hourly_s]
        ).rowcount
    return CompactionResult(rolled, deleted)
