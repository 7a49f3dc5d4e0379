"""`[notify]` and `[alerts]`: defaults, and every mistake named with its fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bot.app.config import ConfigError, parse
from bot.slack.identity import SLACK

SERVERS = {"servers": {"a": {"url": "http://h:1"}}}


def config(tmp_path: Path, **sections: Any) -> Any:
    return parse({**SERVERS, **sections}, tmp_path / "k.toml", ids=SLACK)


def test_defaults(tmp_path: Path) -> None:
    c = config(tmp_path)
    assert (c.notify.approvers, c.notify.remind_before_s) == ("mention", 600.0)
    assert c.alerts.enabled and c.alerts.channel is None and c.alerts.regression == 0.2
    assert c.alerts.group_window_s == 600.0
    set_ = config(
        tmp_path,
        notify={"approvers": "dm", "remind_before": "off"},
        alerts={
            "channel": "C0OPS",
            "raise_after": "5m",
            "clear_after": "1h",
            "regression": 0,
            "group_window": "2m",
        },
    )
    assert (set_.notify.approvers, set_.notify.remind_before_s) == ("dm", 0.0)
    assert (set_.alerts.raise_after_s, set_.alerts.clear_after_s) == (300.0, 3600.0)
    assert set_.alerts.group_window_s == 120.0


@pytest.mark.parametrize(
    ("sections", "needle"),
    [
        ({"notify": {"approvers": "email"}}, "notify.approvers: 'email' is not one of"),
        ({"notify": {"remind_before": 10}}, "has no unit"),
        ({"notify": {"remind": "10m"}}, "unknown key"),
        ({"notify": "dm"}, "expected a table"),
        ({"alerts": {"channel": "#ops"}}, "is not a Slack ID"),
        ({"alerts": {"regression": 1.5}}, "a fall as a share"),
        ({"alerts": {"raise_after": "soon"}}, "alerts.raise_after"),
        ({"alerts": {"group_window": "soon"}}, "alerts.group_window"),
        ({"alerts": {"enabled": "yes"}}, "alerts.enabled"),
    ],
)
def test_mistakes_are_named(tmp_path: Path, sections: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        config(tmp_path, **sections)
