"""How long a report takes for a server with a month of samples, and how big the data gets.

    python -m bench.report [--days 30] [--year] [--repeat 5]

Writes ``--days`` of 15-second samples for one server (a daily load cycle and a restart, from
``tests.bot.reports.synthetic``) into a fresh SQLite file, compacting once per simulated day with
the default retention (raw 3 days, 5-minute roll-ups 35 days, hourly 400 days) as the sampler
does, with a kept experiment and a configuration change on the last day. Then it times
``build_report`` for the last 24 hours (raw samples), 7 days and 30 days (roll-ups), and
rendering the text, the blocks and the chart. ``--year`` also writes a year of samples to show
the database size that retention keeps.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bot.reports.report import render_chart, render_text, report_message
from bot.slack.blocks import blocks
from playbooks.reports.throughput import build_report
from storage.db import open_db
from storage.experiments import State, create_experiment, set_result, transition
from storage.metric_samples import Retention
from storage.server_snapshots import record_snapshot
from tests.bot.reports.synthetic import DAY, generate

INFO = {
    "version": "0.5.10",
    "mem_fraction_static": 0.85,
    "max_total_num_tokens": 116171,
    "tp_size": 8,
    "internal_states": [{"memory_usage": {"weight": 69.25, "kvcache": 7.6, "graph": 2.0}}],
}


def populate(path: Path, days: float, start: float) -> float:
    """Write the history; returns the seconds it took."""
    db = open_db(path)
    began = time.perf_counter()
    record_snapshot(db, "incident", start, INFO)
    generate(
        db,
        "incident",
        start,
        days,
        interval_s=15.0,
        restart_at=start + (days - 0.6) * DAY,
        retention=Retention(),
    )
    end = datetime.fromtimestamp(start + days * DAY, UTC)
    changed = end - timedelta(hours=14)
    record_snapshot(db, "incident", changed.timestamp(), {**INFO, "mem_fraction_static": 0.88})
    exp = create_experiment(
        db,
        server="incident",
        change={"mem_fraction_static": 0.88},
        baseline_config={"args": []},
        trial_config={"args": []},
        settings={},
        actor="bench",
        now=changed - timedelta(hours=1),
        state=State.deciding,
    )
    set_result(
        db,
        exp,
        {"verdict": "improved", "effect": {"mean": 0.27, "ci95": [0.22, 0.31]}},
        now=changed,
    )
    transition(db, exp, State.kept, actor="bench", reason="improved", now=changed)
    db.close()
    return time.perf_counter() - began


def timed(repeat: int, fn: object) -> tuple[float, float]:
    assert callable(fn)
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times), max(times)


def level_rows(path: Path) -> dict[str, int]:
    db = open_db(path)
    rows = {
        "raw samples": db.execute("SELECT COUNT(*) FROM metric_samples").fetchone()[0],
        "5-minute buckets": db.execute(
            "SELECT COUNT(*) FROM metric_rollups WHERE bucket_s = 300"
        ).fetchone()[0],
        "1-hour buckets": db.execute(
            "SELECT COUNT(*) FROM metric_rollups WHERE bucket_s = 3600"
        ).fetchone()[0],
    }
    db.close()
    return rows


def size_mib(path: Path) -> float:
    total = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    return total / 2**20


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.report")
    p.add_argument("--days", type=float, default=30.0)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--year", action="store_true", help="also write 365 days for the size")
    ns = p.parse_args()
    start = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kvpilot.db"
        took = populate(path, ns.days, start)
        end = datetime.fromtimestamp(start + ns.days * DAY, UTC)
        print(f"{ns.days:g} days of 15 s samples written and compacted in {took:.1f} s")
        for level, count in level_rows(path).items():
            print(f"  {level}: {count:,}")
        print(f"  database size: {size_mib(path):.2f} MiB")
        db = open_db(path)
        for label, window in (("24 h", 1.0), ("7 days", 7.0), ("30 days", 30.0)):
            since = end - timedelta(days=min(window, ns.days))

            def build(since: datetime = since) -> object:
                return build_report(db, "incident", since=since, until=end)

            median, worst = timed(ns.repeat, build)
            report = build_report(db, "incident", since=since, until=end)
            print(
                f"build_report, {label}: median {median * 1000:.0f} ms, max {worst * 1000:.0f} ms "
                f"(level {report.resolution_s or 'raw'}, {len(report.series)} chart points)"
            )
        report = build_report(db, "incident", since=end - timedelta(days=1), until=end)
        for label, fn in (
            ("render_text", lambda: render_text(report, "Europe/Berlin")),
            ("render_blocks", lambda: blocks(report_message(report, "Europe/Berlin"))),
            ("render_chart", lambda: render_chart(report, "Europe/Berlin")),
        ):
            median, worst = timed(ns.repeat, fn)
            print(f"{label}: median {median * 1000:.0f} ms, max {worst * 1000:.0f} ms")

        worst_of_all = 0.0
        for label, days in (("daily report", 1.0), ("30-day report", min(30.0, ns.days))):

            def everything(days: float = days) -> None:
                r = build_report(db, "incident", since=end - timedelta(days=days), until=end)
                render_text(r)
                blocks(report_message(r))
                render_chart(r)

            median, worst = timed(ns.repeat, everything)
            worst_of_all = max(worst_of_all, worst)
            print(f"{label}, built and rendered: median {median:.2f} s, max {worst:.2f} s")
        print(f"target under 2 s: {'met' if worst_of_all < 2 else 'MISSED'}")
        db.close()
    if ns.year:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "kvpilot.db"
            took = populate(path, 365, start)
            rows = level_rows(path)
            print(f"365 days written and compacted in {took:.0f} s: {size_mib(path):.2f} MiB")
            for level, count in rows.items():
                print(f"  {level}: {count:,}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
