"""Posting reports to a local Slack-compatible server: the message, then the three-step upload."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from sqlite_utils import Database

from bot.app.config import parse
from bot.cli import main
from bot.reports.report import post_report
from bot.reports.schedule import Deliver, ReportScheduler, surface_delivery
from bot.slack.surface import SlackSurface
from playbooks.reports.throughput import build_report
from storage.db import open_db
from storage.report_runs import runs
from tests.bot.reports.test_render import START, store_day
from tests.slackfake import FakeSlack

CHANNEL = "C0REPORTS"


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with FakeSlack() as fake:
        yield fake


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = open_db(tmp_path / "kvpilot.db")
    store_day(database)
    yield database
    database.close()


def client(slack: FakeSlack) -> WebClient:
    return WebClient(token="xoxb-test", base_url=slack.api_url, timeout=5)


def surface(slack: FakeSlack, channel: str = CHANNEL) -> SlackSurface:
    return SlackSurface(client(slack), channel)


def delivery(slack: FakeSlack) -> Deliver:
    return surface_delivery(lambda channel: surface(slack, channel))


def test_a_report_is_a_message_with_its_chart_in_the_thread(slack: FakeSlack, db: Database) -> None:
    report = build_report(db, "s", since=START, until=START + timedelta(days=1))
    post_report(surface(slack), report, tz="Europe/Berlin")
    assert slack.violations == []
    (post,) = slack.calls("chat.postMessage")
    assert post.params["channel"] == CHANNEL and "tok/s generation" in post.params["text"]
    (ts, message), *_ = slack.messages(CHANNEL).items()
    assert message["blocks"][0]["type"] == "header"
    # files_upload_v2: get an upload URL, send the bytes there, complete into the thread
    get_url = slack.calls("files.getUploadURLExternal")
    upload = slack.calls("upload")
    complete = slack.calls("files.completeUploadExternal")
    assert len(get_url) == len(upload) == len(complete) == 1
    assert get_url[0].params["filename"].endswith(".png")
    assert int(get_url[0].params["length"]) == len(upload[0].raw)
    (chart,) = slack.files
    assert chart.channel == CHANNEL and chart.thread_ts == ts
    assert chart.content.startswith(b"\x89PNG") and chart.filename == "kvpilot-s-20260303-0900.png"


def test_slack_errors_reach_the_caller(slack: FakeSlack, db: Database) -> None:
    report = build_report(db, "s", since=START, until=START + timedelta(days=1))
    slack.fail_next("chat.postMessage", error="not_in_channel")
    with pytest.raises(SlackApiError) as failure:
        post_report(surface(slack), report)
    assert failure.value.response["error"] == "not_in_channel"
    assert slack.files == []  # no chart without its message


def test_the_scheduler_posts_through_slack_once(
    slack: FakeSlack, db: Database, tmp_path: Path
) -> None:
    config = parse(
        {
            "kvpilot": {"database": "kvpilot.db"},
            "servers": {"s": {"url": "http://127.0.0.1:9"}},
            "reports": [{"channel": CHANNEL, "cron": "0 10 * * *", "timezone": "Europe/Berlin"}],
        },
        tmp_path / "kvpilot.toml",
    )
    now = datetime(2026, 3, 3, 10, 20, tzinfo=ZoneInfo("Europe/Berlin"))
    sched = ReportScheduler(config, db, deliver=delivery(slack), clock=lambda: now)
    (result,) = sched.run_due()
    assert result.status == "sent" and result.late
    assert sched.run_due() == []
    assert len(slack.calls("chat.postMessage")) == 1 and len(slack.files) == 1
    assert slack.violations == []
    (row,) = runs(db)
    assert row.status == "sent"
    # a failing channel is recorded as a failed run with Slack's error
    slack.fail_next("chat.postMessage", error="channel_not_found")
    tomorrow = now + timedelta(days=1)
    failing = ReportScheduler(config, db, deliver=delivery(slack), clock=lambda: tomorrow)
    (result,) = failing.run_due()
    assert result.status == "failed" and "channel_not_found" in result.detail


def run_cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def config_file(tmp_path: Path, db: Database) -> Path:
    path = tmp_path / "kvpilot.toml"
    path.write_text(
        '[kvpilot]\ndatabase = "kvpilot.db"\n'
        '[servers.s]\nurl = "http://127.0.0.1:9"\n'
        f'[[reports]]\nchannel = "{CHANNEL}"\ncron = "0 9 * * *"\ntimezone = "Europe/Berlin"\n'
    )
    return path


def test_kvpilot_report_prints_posts_and_refuses_bad_input(
    slack: FakeSlack,
    config_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    until = "2026-03-03T10:00"
    code, out, err = run_cli(
        "report", "--config", str(config_file), "--server", "s", "--until", until
    )
    assert code == 0, err
    assert "kvpilot report: s, 2026-03-02 10:00 CET to 2026-03-03 10:00 CET (24 h)" in out
    code, out, _ = run_cli(
        "report",
        "--config",
        str(config_file),
        "--server",
        "s",
        "--until",
        until,
        "--json",
        "--since",
        "12h",
        "--chart",
        str(tmp_path / "c.png"),
    )
    data = json.loads(out)
    assert code == 0 and data["tokens_generated"] == 2880 * 9000  # 12 h of 15 s samples
    assert data["since"] == "2026-03-02T21:00:00+00:00" and data["diagnosis"]["bottleneck"]
    assert (tmp_path / "c.png").read_bytes().startswith(b"\x89PNG")
    # posting needs a token; with one it goes to the server's report channel
    monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)
    code, _, err = run_cli("report", "--config", str(config_file), "--server", "s", "--post")
    assert code == 2 and "SLACK_BOT_TOKEN" in err
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-test")
    monkeypatch.setenv("SLACK_API_URL", slack.api_url)
    code, out, err = run_cli(
        "report", "--config", str(config_file), "--server", "s", "--until", until, "--post"
    )
    assert code == 0, err
    assert f"posted the report of s to {CHANNEL}" in out and len(slack.files) == 1
    slack.fail_next("chat.postMessage", error="not_in_channel")
    code, _, err = run_cli("report", "--config", str(config_file), "--server", "s", "--post")
    assert code == 1 and "not_in_channel" in err and "/invite" in err
    # bad input: one line that says what to do, never a traceback
    for args, words in (
        (("--server", "nope"), "unknown server 'nope'"),
        (("--server", "s", "--since", "yesterday"), "is not a duration"),
        (("--server", "s", "--until", "noon"), "is not a time"),
        (("--server", "s", "--timezone", "Mars/Olympus"), "is not a time zone"),
        (("--server", "s", "--since", "99999999999w"), "at most 3650 days"),
        (("--server", "s", "--until", "0001-01-02T00:00"), "starts before 1970"),
    ):
        code, _, err = run_cli("report", "--config", str(config_file), *args)
        assert code == 2 and words in err and "Traceback" not in err, err
