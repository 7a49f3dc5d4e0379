"""One time line per time scale, shared by every process that opens the database.

Against a twin accelerated K times, a process's scaled clock runs K times faster than the wall
clock. If each process began its calendar where the newest stored row ends, the time the bot
spent dead would vanish from the time line while the twin went on running, and a measurement
resumed after a crash would join two stretches of the twin's time as if they were adjacent. So
each process records an anchor (its calendar time at a wall-clock moment), and the next one
continues from it: calendar = anchor calendar + (wall now - anchor wall) x K.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlite_utils import Database


@dataclass(frozen=True)
class Anchor:
    scale: float
    wall_ts: float  # epoch seconds of the wall clock
    calendar_ts: float  # epoch seconds on the scaled time line at that moment


def anchor_for(db: Database, scale: float) -> Anchor | None:
    """The anchor recorded for `scale`, if any."""
    row = db.execute(
        "SELECT scale, wall_ts, calendar_ts FROM clock_anchors WHERE scale = ?", [float(scale)]
    ).fetchone()
    return None if row is None else Anchor(float(row[0]), float(row[1]), float(row[2]))


def record_anchor(db: Database, anchor: Anchor) -> None:
    """Replace the anchor of `anchor.scale`."""
    db.execute(
        "INSERT INTO clock_anchors (scale, wall_ts, calendar_ts) VALUES (?, ?, ?)"
        " ON CONFLICT (scale) DO UPDATE SET wall_ts = excluded.wall_ts,"
        " calendar_ts = excluded.calendar_ts",
        [float(anchor.scale), anchor.wall_ts, anchor.calendar_ts],
    )
    db.conn.commit()


def continued(anchor: Anchor, wall_now: float) -> float:
    """The calendar time now on the anchor's time line."""
    return anchor.calendar_ts + max(0.0, wall_now - anchor.wall_ts) * anchor.scale
