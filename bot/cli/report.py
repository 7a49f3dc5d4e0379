"""`kvpilot report`: a server's throughput report from stored samples, printed or posted.

Heavy imports (matplotlib, and the Slack surface from `bot/slack` for `--post`) happen only when
the command runs, so the rest of the command line starts as fast as before.
"""

from __future__ import annotations

import argparse
import json
import os
import zoneinfo
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from bot.cli.output import add_output

if TYPE_CHECKING:
    from sqlite_utils import Database

    from bot.app.config import Config
    from playbooks.reports.throughput import Report

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def add_report_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "report", help="a server's throughput report (last 24 h by default), printed or posted"
    )
    p.add_argument("--config", default=None, help="kvpilot.toml")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--server", help="a server name from the configuration")
    which.add_argument(
        "--group",
        metavar="NAME",
        help="a [groups.NAME] of the configuration: one summary, the servers losing most first",
    )
    which.add_argument("--all", action="store_true", help="every configured server, summarised")
    p.add_argument(
        "--since",
        default="24h",
        metavar="DURATION",
        help="how far back the report reaches, e.g. 24h, 7d, 90m (default 24h)",
    )
    p.add_argument(
        "--until",
        default=None,
        metavar="TIME",
        help="end of the window, ISO 8601 such as 2026-12-01T09:00+01:00 (default: now)",
    )
    p.add_argument(
        "--timezone",
        default=None,
        help="show times in this zone (default: the server's [[reports]] zone, else UTC)",
    )
    add_output(p, "print the report as one JSON object")
    p.add_argument("--chart", default=None, metavar="PNG", help="also write the chart here")
    p.add_argument(
        "--post",
        action="store_true",
        help="post to Slack (SLACK_BOT_TOKEN; SLACK_API_URL for another API endpoint)",
    )
    p.add_argument(
        "--channel",
        default=None,
        help="with --post: channel ID (default: the server's first [[reports]] channel)",
    )


def _until(text: str | None, zone: zoneinfo.ZoneInfo, fallback: datetime) -> datetime:
    if text is None:
        return fallback
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"--until {text!r} is not a time; use ISO 8601 such as 2026-12-01T09:00 (read in "
            "--timezone) or 2026-12-01T09:00+01:00"
        ) from None
    return moment.replace(tzinfo=zone) if moment.tzinfo is None else moment


def _since(until: datetime, window: str) -> datetime:
    """The report's start, `window` before `until`; ValueError before 1970 (no sample is older)
    or before the year 1 (past what a datetime holds)."""
    from playbooks.reports.throughput import parse_window  # noqa: PLC0415

    try:
        since = until - parse_window(window)
    except OverflowError:
        since = EPOCH - timedelta(days=1)
    if since < EPOCH:
        raise ValueError(
            f"--since {window} before --until {until:%Y-%m-%d} starts before 1970, "
            "where no sample can be"
        )
    return since


def cmd_report(ns: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from bot.app.config import ConfigError, load, warn_to  # noqa: PLC0415 - see the module docstring
    from bot.app.wiring import database, engine_of, make_clock  # noqa: PLC0415
    from bot.cli.chat import CHAT_IDS  # noqa: PLC0415
    from bot.reports.report import render_chart, render_text  # noqa: PLC0415
    from playbooks.reports.throughput import build_report  # noqa: PLC0415
    from storage.errors import StorageError  # noqa: PLC0415
    from storage.metric_samples import sampled_servers  # noqa: PLC0415

    try:
        config = load(ns.config, warn=warn_to(err), ids=CHAT_IDS)
        db = database(config)
    except (ConfigError, StorageError) as exc:
        err.write(f"error: {exc}\n")
        return EXIT_USAGE
    if ns.server is None:
        return _fleet(ns, config, db, out, err)
    schedules = [r for r in config.reports if ns.server in r.servers]
    try:
        if ns.server not in config.servers and ns.server not in sampled_servers(db):
            config.server(ns.server)  # raises with the configured names
        tz_name = ns.timezone or (schedules[0].timezone if schedules else "UTC")
        try:
            zone = zoneinfo.ZoneInfo(tz_name)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"--timezone {tz_name!r} is not a time zone; use an IANA name such as "
                "Europe/Berlin or UTC"
            ) from None
        # on the stored time line: an accelerated twin's samples run ahead of the wall clock
        until = _until(ns.until, zone, make_clock(config, db).utcnow())
        since = _since(until, ns.since)
        report = build_report(
            db, ns.server, since=since, until=until, engine=engine_of(config, ns.server)
        )
    except (ConfigError, ValueError) as exc:
        err.write(f"error: {exc}\n")
        return EXIT_USAGE
    if ns.chart:
        try:
            Path(ns.chart).write_bytes(render_chart(report, zone))
        except OSError as exc:
            err.write(f"error: cannot write the chart to {ns.chart}: {exc.strerror}\n")
            return EXIT_FAILED
    if ns.post:
        return _post(ns, schedules[0].channel if schedules else None, report, zone, out, err)
    if ns.json:
        out.write(json.dumps(report.to_json()) + "\n")
    else:
        out.write(render_text(report, zone))
    return EXIT_OK


def _fleet(ns: argparse.Namespace, config: Config, db: Database, out: TextIO, err: TextIO) -> int:
    """`--group NAME` or `--all`: the servers summarised in one text (`bot.reports.fleet`)."""
    from bot.app.config import ConfigError  # noqa: PLC0415 - see the module docstring
    from bot.app.wiring import engine_of, make_clock  # noqa: PLC0415
    from bot.reports.fleet import build_fleet, fleet_text, label  # noqa: PLC0415
    from playbooks.reports.throughput import build_report, parse_window  # noqa: PLC0415

    if ns.post or ns.chart or ns.json:
        err.write(
            "error: --group and --all print a summary; --post, --chart and --json need --server\n"
        )
        return EXIT_USAGE
    group = "*" if ns.all else ns.group
    if group != "*" and group not in config.groups:
        known = ", ".join(sorted(config.groups)) or "none configured; see [groups.NAME]"
        err.write(f"error: unknown group {group!r}; groups: {known}\n")
        return EXIT_USAGE
    servers = [s for s, c in config.servers.items() if group in ("*", c.group)]
    if not servers:
        err.write("error: no servers to report on\n")
        return EXIT_USAGE
    try:
        zone = zoneinfo.ZoneInfo(ns.timezone or "UTC")
        until = _until(ns.until, zone, make_clock(config, db).utcnow())
        since = until - parse_window(ns.since)
        summary = build_fleet(
            label(group),
            servers,
            since,
            until,
            lambda server, start, end: build_report(
                db, server, since=start, until=end, engine=engine_of(config, server)
            ),
        )
    except (ConfigError, ValueError, zoneinfo.ZoneInfoNotFoundError) as exc:
        err.write(f"error: {exc}\n")
        return EXIT_USAGE
    out.write(fleet_text(summary, zone))
    return EXIT_OK


def _post(
    ns: argparse.Namespace,
    default_channel: str | None,
    report: Report,
    zone: zoneinfo.ZoneInfo,
    out: TextIO,
    err: TextIO,
) -> int:
    from bot.reports.report import post_report  # noqa: PLC0415
    from bot.slack.surface import (  # noqa: PLC0415 - slack_sdk loads only for --post
        SLACK_API,
        Refused,
        SlackSurface,
        refusal,
        web_client,
    )

    channel = ns.channel or default_channel
    if not channel:
        err.write(
            "error: --post needs a channel: pass --channel C0123ABCD or add a [[reports]] entry "
            "for this server\n"
        )
        return EXIT_USAGE
    token = os.environ.get("SLACK_BOT_TOKEN")
    if not token:
        err.write("error: --post needs the bot token in SLACK_BOT_TOKEN (xoxb-...)\n")
        return EXIT_USAGE
    base_url = os.environ.get("SLACK_API_URL") or SLACK_API
    surface = SlackSurface(web_client(token, base_url, timeout=30, retries=False), channel)
    try:
        post_report(surface, report, tz=zone)
    except Refused as exc:
        code = refusal(exc)
        err.write(f"error: Slack refused the report: {code}\n")
        if code == "not_in_channel":
            err.write(f"  invite the bot to {channel} first (/invite @kvpilot)\n")
        return EXIT_FAILED
    except OSError as exc:
        err.write(f"error: cannot reach Slack at {base_url}: {exc}\n")
        return EXIT_FAILED
    out.write(f"posted the report of {report.server} to {channel}\n")
    return EXIT_OK
