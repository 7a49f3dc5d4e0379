"""`[sampler]` and `[[reports]]` in kvpilot.toml: defaults, and errors that say what to fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bot.app.config import Config, ConfigError, parse
from bot.slack.identity import SLACK

SERVERS = {"a": {"url": "http://127.0.0.1:1"}, "b": {"url": "http://127.0.0.1:2"}}


def load(**tables: Any) -> Config:
    return parse({"servers": SERVERS, **tables}, Path("/etc/kvpilot/kvpilot.toml"), ids=SLACK)


def report(**values: Any) -> dict[str, Any]:
    return {"channel": "C0OPS", "cron": "0 9 * * *", **values}


def test_defaults() -> None:
    config = load(reports=[report()])
    assert config.sampler.interval_s == 15 and config.sampler.enabled
    assert config.sampler.raw_retention_s == 3 * 86400
    assert config.sampler.hourly_retention_s == 400 * 86400
    assert config.sampler.monitor_retention_s == 2 * 3600
    assert config.sampler.prometheus_batch  # servers sharing a Prometheus: one query a round
    assert not load(sampler={"prometheus_batch": False}).sampler.prometheus_batch
    (r,) = config.reports
    assert r.timezone == "UTC" and r.servers == ("a", "b")  # every server by default
    assert r.window_s == 86400 and r.grace_s == 6 * 3600 and r.name == "C0OPS 0 9 * * *"
    assert load().reports == ()


def test_a_full_entry() -> None:
    config = load(
        sampler={
            "interval_s": 30,
            "raw_retention": "2d",
            "five_minute_retention": "60d",
            "monitor_retention": "6h",
        },
        reports=[
            report(name="morning", timezone="Europe/Berlin", servers=["b"], grace="2h"),
            report(name="weekly", cron="0 8 * * mon", window="7d"),
        ],
    )
    assert config.sampler.interval_s == 30 and config.sampler.raw_retention_s == 2 * 86400
    assert config.sampler.monitor_retention_s == 6 * 3600
    morning, weekly = config.reports
    assert morning.servers == ("b",) and morning.grace_s == 7200
    assert weekly.window_s == 7 * 86400


def test_a_group_of_servers() -> None:
    config = parse(
        {
            "servers": {**SERVERS, "c": {"url": "http://127.0.0.1:3", "group": "kimi"}},
            "groups": {"kimi": {"max_concurrent_restarts": 1}},
            "reports": [report(group="kimi")],
        },
        Path("/etc/kvpilot/kvpilot.toml"),
    )
    assert config.reports[0].servers == ("c",)
    with pytest.raises(ConfigError, match="no server is in group 'gpu'"):
        load(reports=[report(group="gpu")])


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        ({"reports": [report(cron="0 9 * *")]}, "reports[0].cron: '0 9 * *' is not a cron"),
        ({"reports": [report(cron="0 25 * * *")]}, "higher than the maximum value (23)"),
        (
            {"reports": [report(timezone="Europe/Berln")]},
            "unknown time zone 'Europe/Berln' (did you mean Europe/Berlin",
        ),
        ({"reports": [report(channel="#ops")]}, "reports[0].channel: '#ops' is not a Slack ID"),
        ({"reports": [report(servers=["c"])]}, "unknown server(s) c (configured: a, b)"),
        ({"reports": [report(grace="soon")]}, "reports[0].grace: 'soon' is not a duration"),
        ({"reports": [{"cron": "0 9 * * *"}]}, "reports[0].channel: required"),
        ({"reports": [report(), report()]}, "is used twice; give each report a distinct name"),
        ({"reports": [report(servers=["a"], group="g")]}, "give servers or group, not both"),
        ({"reports": [report(colour="red")]}, "reports[0]: unknown key(s) colour"),
        ({"reports": {"channel": "C1"}}, "reports: expected [[reports]] entries"),
        ({"sampler": {"interval_s": 0.5}}, "sampler.interval_s: between 1 and 300 seconds"),
        ({"sampler": {"raw_retention": "10m"}}, 'sampler.raw_retention: at least "1h"'),
        (
            {"sampler": {"raw_retention": "10d", "five_minute_retention": "5d"}},
            "five_minute_retention: must be at least raw_retention",
        ),
        ({"sampler": {"enabled": "yes"}}, "sampler.enabled: expected true or false"),
        ({"sampler": {"prometheus_batch": 1}}, "sampler.prometheus_batch: expected true or false"),
        ({"sampler": {"monitor_retention": "30m"}}, 'sampler.monitor_retention: at least "45m"'),
        ({"sampler": {"monitor_retention": "often"}}, "'often' is not a duration"),
    ],
)
def test_mistakes_are_named(tables: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as failure:
        load(**tables)
    assert message in str(failure.value)
