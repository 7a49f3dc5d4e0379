"""`/kvpilot report` (and `report` in the console): the daily report, on demand, in the channel.

`report NAME` posts the server's report and chart; `report --group NAME` and `report --all` post
one summary of many servers (`bot.reports.fleet`).

The window ends at the sampler's "now", which against an accelerated twin is the twin's own
time, so the report covers what the samples cover.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from sqlite_utils import Database

from bot.chat.auth import Principal
from bot.chat.commands import Command
from bot.chat.surface import Surface
from playbooks.engines.base import Engine

ReportHook = Callable[[Command, Principal, Surface], None]


def make_report_hook(
    db: Callable[[], Database],
    now: Callable[[], datetime],
    engine: Callable[[str], Engine] | None = None,
) -> ReportHook:
    """`engine` names the engine of a server (the default engine's rules when not given)."""

    def report(cmd: Command, who: Principal, surface: Surface) -> None:
        from bot.reports import report as reports  # noqa: PLC0415 - matplotlib loads only when a report is asked
        from bot.reports.fleet import build_fleet, label, post_fleet  # noqa: PLC0415
        from playbooks.reports.throughput import build_report  # noqa: PLC0415

        until = now()
        if cmd.group is not None:  # `report --group NAME` or `--all`: one summary
            database = db()
            summary = build_fleet(
                label(cmd.group),
                cmd.members,
                until - cmd.since,
                until,
                lambda server, since, end: build_report(
                    database,
                    server,
                    since=since,
                    until=end,
                    engine=None if engine is None else engine(server),
                ),
            )
            post_fleet(surface, summary)
            return
        assert cmd.server is not None
        result = build_report(
            db(),
            cmd.server,
            since=until - cmd.since,
            until=until,
            engine=None if engine is None else engine(cmd.server),
        )
        reports.post_report(surface, result)

    return report
