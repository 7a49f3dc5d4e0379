"""`report --group NAME`, `report --all` and a scheduled report of many servers: one summary."""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlite_utils import Database

from bot.app.config import Config, ReportSchedule, parse
from bot.app.wiring import engine_of
from bot.chat.auth import Principal
from bot.chat.commands import CommandError, parse_command
from bot.cli.report import cmd_report
from bot.reports.hook import make_report_hook
from bot.reports.schedule import ReportScheduler
from playbooks.reports.fleet import FleetSummary
from playbooks.reports.throughput import Report
from storage.db import open_db
from storage.report_runs import runs
from tests.bot.app.memory_chat.surface import MemorySurface


def fleet_config(
    tmp_path: Path, n: int = 20, reports: list[dict[str, Any]] | None = None
) -> Config:
    servers = {
        f"s{i:02d}": {
            "url": f"http://127.0.0.1:{9000 + i}",
            "engine": "sglang",  # not detected over the network: nothing listens there
            "group": "a" if i % 2 else "b",
        }
        for i in range(n)
    }
    table: dict[str, Any] = {
        "kvpilot": {"database": "kvpilot.db"},
        "servers": servers,
        "groups": {"a": {"max_concurrent_restarts": 1}, "b": {"max_concurrent_restarts": 1}},
    }
    if reports is not None:
        table["reports"] = reports
    return parse(table, tmp_path / "kvpilot.toml")


@pytest.mark.parametrize(
    ("text", "group", "members"),
    [
        ("report --group a", "a", 10),
        ("report --group=b --since 7d", "b", 10),
        ("report --since 2h --all", "*", 20),
    ],
)
def test_a_group_or_fleet_report_names_its_servers(
    tmp_path: Path, text: str, group: str, members: int
) -> None:
    cmd = parse_command(text, fleet_config(tmp_path))
    assert (cmd.name, cmd.group, len(cmd.members), cmd.server) == ("report", group, members, None)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("report --group c", r"unknown group `c`; groups: a, b"),
        ("report --group aa", r"did you mean `a`\?"),
        ("report --group", "usage"),
        ("report --group a s01", "usage"),
        ("report --all --group a", "usage"),
    ],
)
def test_an_unknown_group_names_the_known_ones(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(CommandError, match=needle):
        parse_command(text, fleet_config(tmp_path))


class FleetRecorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, FleetSummary]] = []
        self.each: list[str] = []

    def __call__(self, schedule: ReportSchedule, summary: FleetSummary) -> None:
        self.sent.append((schedule.name, summary))

    def one(self, schedule: ReportSchedule, report: Report) -> None:
        self.each.append(report.server)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = open_db(tmp_path / "kvpilot.db")
    yield database
    database.close()


def test_a_scheduled_report_of_many_servers_is_one_summary(tmp_path: Path, db: Database) -> None:
    reports = [
        {"name": "fleet", "channel": "C0FLEET", "cron": "0 9 * * *"},  # all 20 servers
        {"name": "group-a", "channel": "C0A", "cron": "0 9 * * *", "group": "a"},  # 10: each
    ]
    config = fleet_config(tmp_path, reports=reports)
    sent = FleetRecorder()
    at = datetime(2026, 12, 6, 9, 0, 1, tzinfo=UTC)
    sched = ReportScheduler(config, db, deliver=sent.one, deliver_fleet=sent, clock=lambda: at)
    results = sched.run_due()
    assert sorted(r.status for r in results) == ["sent", "sent"]
    ((name, summary),) = sent.sent
    assert name == "fleet" and summary.name == "report fleet" and summary.servers == 20
    assert summary.until - summary.since == timedelta(days=1)
    assert sorted(sent.each) == [f"s{i:02d}" for i in range(1, 20, 2)]  # the group's, each
    assert [r.status for r in runs(db, "fleet")] == ["sent"]


def test_a_group_schedule_is_named_by_its_group(tmp_path: Path, db: Database) -> None:
    reports = [{"name": "daily", "channel": "C0A", "cron": "0 9 * * *", "group": "a"}]
    config = fleet_config(tmp_path, n=40, reports=reports)
    assert config.reports[0].group == "a"
    sent = FleetRecorder()
    at = datetime(2026, 12, 6, 9, 0, 1, tzinfo=UTC)
    ReportScheduler(config, db, deliver=sent.one, deliver_fleet=sent, clock=lambda: at).run_due()
    ((_, summary),) = sent.sent
    assert summary.name == "group a" and summary.servers == 20 and sent.each == []


def test_the_command_line_prints_a_group_summary(tmp_path: Path) -> None:
    config = fleet_config(tmp_path)
    toml = tmp_path / "kvpilot.toml"
    servers = "\n".join(
        f'[servers.{name}]\nurl = "{s.url}"\nengine = "sglang"\ngroup = "{s.group}"'
        for name, s in config.servers.items()
    )
    toml.write_text(
        f'[kvpilot]\ndatabase = "{tmp_path / "kvpilot.db"}"\n'
        "[groups.a]\nmax_concurrent_restarts = 1\n[groups.b]\nmax_concurrent_restarts = 1\n"
        + servers
        + "\n"
    )
    from bot.cli.app import build_parser  # noqa: PLC0415

    def run(*args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        ns = build_parser().parse_args(["report", "--config", str(toml), *args])
        return cmd_report(ns, out, err), out.getvalue(), err.getvalue()

    code, out, _ = run("--group", "a")
    assert code == 0 and "Throughput report: group a (10 servers)" in out
    assert "no samples in the window" in out
    code, out, _ = run("--all")
    assert code == 0 and "the fleet (20 servers)" in out and "…and 10 more server(s)" in out
    code, _, err = run("--group", "zz")
    assert code == 2 and "unknown group 'zz'; groups: a, b" in err
    code, _, err = run("--group", "a", "--json")
    assert code == 2 and "need --server" in err


def test_the_chat_command_posts_one_summary(tmp_path: Path, db: Database) -> None:
    config = fleet_config(tmp_path, n=40)
    log: list[tuple[str, str]] = []
    surface = MemorySurface("C0OPS", log, lambda user: user)
    at = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)
    hook = make_report_hook(lambda: db, lambda: at, lambda name: engine_of(config, name))
    hook(parse_command("report --group a", config), Principal("U1", "C0OPS"), surface)
    ((channel, text),) = log  # one message, no chart
    assert channel == "C0OPS" and "Throughput report: group a (20 servers)" in text
    assert "…and 10 more server(s)" in text
