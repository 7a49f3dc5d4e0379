"""Whether a restart may start: freezes by scope, change windows in their time zone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.app.config import ConfigError, parse
from bot.app.holds import hold_for
from storage.freezes import Freeze

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)  # a Friday


def config(tmp_path: Path, **server: Any) -> Any:
    data = {
        "servers": {"a": {"url": "http://h:1", "group": "kimi", **server}},
        "groups": {"kimi": {}},
    }
    return parse(data, tmp_path / "k.toml")


def freeze(scope: str, target: str, until: datetime | None = None) -> Freeze:
    return Freeze(1, scope, target, "incident", "U1", NOW, until)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("f", "held"),
    [
        (freeze("all", "*"), True),
        (freeze("server", "a"), True),
        (freeze("server", "b"), False),
        (freeze("group", "kimi"), True),
        (freeze("group", "other"), False),
    ],
)
def test_a_freeze_holds_the_servers_of_its_scope(tmp_path: Path, f: Freeze, held: bool) -> None:
    server = config(tmp_path).server("a")
    assert (hold_for(server, [f], NOW) is not None) is held


def test_a_freeze_says_who_until_when_and_why(tmp_path: Path) -> None:
    server = config(tmp_path).server("a")
    hold = hold_for(server, [freeze("group", "kimi", NOW + timedelta(hours=2))], NOW)
    assert hold is not None
    assert hold.why == "group `kimi` frozen by {@U1} until 2026-12-04 14:00 UTC: incident"
    assert hold.until_ts == (NOW + timedelta(hours=2)).timestamp()
    forever = hold_for(server, [freeze("all", "*")], NOW)
    assert forever is not None and forever.until_ts is None and "until it is lifted" in forever.why


@pytest.mark.parametrize(
    ("window", "now", "opens"),
    [
        # 01:00-05:59 Berlin = 00:00-04:59 UTC in winter
        ({"cron": "* 1-5 * * *", "timezone": "Europe/Berlin"}, NOW, "2026-12-05 01:00 CET"),
        ({"cron": "* 1-5 * * *", "timezone": "Europe/Berlin"}, NOW.replace(hour=3), None),
        ({"cron": "* 1-5 * * *", "timezone": "Europe/Berlin"}, NOW.replace(hour=5), "2026-12-05"),
        # weekends only: Friday noon waits for Saturday 00:00
        ({"cron": ["* * * * sat,sun"]}, NOW, "2026-12-05 00:00 UTC"),
        ({"cron": ["* 0-6 * * mon-fri", "* 12 * * fri"]}, NOW, None),  # either expression
    ],
)
def test_the_change_window(tmp_path: Path, window: Any, now: datetime, opens: str | None) -> None:
    server = config(tmp_path, change_window=window).server("a")
    hold = hold_for(server, [], now)
    if opens is None:
        assert hold is None
        return
    assert hold is not None and f"it opens {opens}" in hold.why
    assert hold.until_ts is not None and hold.until_ts > now.timestamp()


def test_a_group_window_reaches_its_servers_unless_they_set_their_own(tmp_path: Path) -> None:
    data = {
        "servers": {
            "a": {"url": "http://h:1", "group": "kimi"},
            "b": {"url": "http://h:2", "group": "kimi", "change_window": {"cron": "* * * * *"}},
        },
        "groups": {"kimi": {"change_window": {"cron": "* 3 * * *"}}},
    }
    cfg = parse(data, tmp_path / "k.toml")
    assert hold_for(cfg.server("a"), [], NOW) is not None
    assert hold_for(cfg.server("b"), [], NOW) is None


@pytest.mark.parametrize(
    ("window", "needle"),
    [
        ("* 3 * * *", "expected a table"),
        ({"cron": 3}, "expected a cron expression or a list"),
        ({"cron": []}, "expected a cron expression or a list"),
        ({"cron": "* 25 * * *"}, "is not a cron expression"),
        ({"cron": "* 3 * * *", "timezone": "Europe/Berln"}, "did you mean Europe/Berlin"),
        ({"cron": "* 3 * * *", "tz": "UTC"}, "unknown key"),
    ],
)
def test_window_mistakes_are_named(tmp_path: Path, window: Any, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        config(tmp_path, change_window=window)


def test_a_window_covers_both_passes_of_the_hour_the_clocks_repeat(tmp_path: Path) -> None:
    # Europe/Berlin, 2026-10-25: 02:00-02:59 comes twice (00:00-00:59 and 01:00-01:59 UTC)
    window = {"cron": "* 2 * * *", "timezone": "Europe/Berlin"}
    server = config(tmp_path, change_window=window).server("a")
    for utc in ("00:30", "01:30"):
        hour, minute = map(int, utc.split(":"))
        moment = datetime(2026, 10, 25, hour, minute, tzinfo=UTC)
        assert hold_for(server, [], moment) is None, utc
    assert hold_for(server, [], datetime(2026, 10, 25, 2, 30, tzinfo=UTC)) is not None
