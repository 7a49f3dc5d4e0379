"""`/kvpilot freeze` and `unfreeze`: what is frozen, for how long, why; mistakes named."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.app.config import Config, parse
from bot.chat.auth import Principal, authorise
from bot.chat.commands import CommandError, FreezeSpec, parse_command
from bot.slack.identity import SLACK


@pytest.fixture
def config(tmp_path: Path) -> Config:
    data = {
        "servers": {"a": {"url": "http://h:1", "group": "kimi"}, "b": {"url": "http://h:2"}},
        "groups": {"kimi": {}},
        "access": {"approvers": ["U2"], "operators": ["U1"]},
    }
    return parse(data, tmp_path / "k.toml")


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("freeze", FreezeSpec("all", "*")),
        ("freeze for 2h", FreezeSpec("all", "*", 7200.0)),
        ("freeze for 90m incident 4411", FreezeSpec("all", "*", 5400.0, "incident 4411")),
        ("freeze a", FreezeSpec("server", "a")),
        ("freeze kimi for 1d quarter end", FreezeSpec("group", "kimi", 86400.0, "quarter end")),
        ("freeze all busy", FreezeSpec("all", "*", None, "busy")),
        # not a server or group: the words are the reason, and every server is frozen
        ("freeze all peak traffic", FreezeSpec("all", "*", None, "peak traffic")),
        ("unfreeze", FreezeSpec("all", "*")),
        ("unfreeze kimi", FreezeSpec("group", "kimi")),
        ("unfreeze b", FreezeSpec("server", "b")),
    ],
)
def test_freeze_commands_parse(config: Config, text: str, spec: FreezeSpec) -> None:
    assert parse_command(text, config).freeze == spec


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("freeze for", "`for` needs a duration"),
        ("freeze for soon", "e.g. `for 90m`"),
        ("freeze a for 40d", "at most 30 days"),
        ("unfreeze c", "unknown server or group `c`"),
        # a mistyped name before `for` must not freeze every server, endlessly
        ("freeze aa for 2h", "unknown server or group `aa`"),
        # nor one without `for`: every server is frozen only when asked with `all` or `for`
        ("freeze kmi", "unknown server or group `kmi` .did you mean `kimi`"),
        ("freeze peak traffic", "to freeze every server: `/kvpilot freeze all peak traffic`"),
        ("unfreeze a b", "unknown server or group `b`"),
    ],
)
def test_freeze_mistakes_are_named(config: Config, text: str, needle: str) -> None:
    with pytest.raises(CommandError, match=needle):
        parse_command(text, config)


def test_operators_freeze_and_only_approvers_lift(config: Config) -> None:
    def may(user: str, action: str) -> bool:
        return authorise(
            config.access, Principal(user, "C1"), action,  # type: ignore[arg-type]
            group_members=lambda _g: frozenset(),
        ).allowed  # fmt: skip

    assert may("U1", "freeze") and may("U2", "freeze") and not may("U9", "freeze")
    assert may("U2", "unfreeze") and not may("U1", "unfreeze")


def test_only_a_click_decides_outside_the_allowed_channels(tmp_path: Path) -> None:
    config = parse(
        {
            "servers": {"a": {"url": "http://h:1"}},
            "access": {"approvers": ["U2"]},
            "slack": {"channels": ["C0OPS"]},
        },
        tmp_path / "k.toml",
    )

    def may(where: str, button: bool) -> bool:
        who = Principal("U2", where, button=button)
        return authorise(
            config.access, who, "approve", group_members=lambda _g: frozenset(),
            channels=config.channels, ids=SLACK,
        ).allowed  # fmt: skip

    assert may("C0OPS", False) and may("D0123", True) and may("app_home", True)
    assert not may("D0123", False)  # `/kvpilot approve 12` typed in a direct message
    assert not may("C0OTHER", True)
