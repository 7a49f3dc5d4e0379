"""Groups in kvpilot.toml: validated with errors that say how to fix them, wired to slots."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.app.config import ConfigError, load
from bot.app.wiring import restart_limiter
from storage import memory_db

FLEET = """
[groups.kimi]
max_concurrent_restarts = 2

[groups.llama]

[servers.a]
url = "http://10.0.0.1:30000"
group = "kimi"

[servers.b]
url = "http://10.0.0.2:30000"
group = "kimi"

[servers.solo]
url = "http://10.0.0.3:30000"
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "kvpilot.toml"
    path.write_text(text)
    return str(path)


def test_groups_and_their_servers(tmp_path: Path) -> None:
    config = load(write(tmp_path, FLEET))
    group, servers = config.group_servers("kimi")
    assert group.max_concurrent_restarts == 2 and [s.name for s in servers] == ["a", "b"]
    assert config.groups["llama"].max_concurrent_restarts == 1  # the default
    assert config.server("solo").group is None
    db = memory_db()
    limiter = restart_limiter(config, config.server("a"), db)
    assert limiter is not None and (limiter.group, limiter.limit) == ("kimi", 2)
    assert restart_limiter(config, config.server("solo"), db) is None
    with pytest.raises(ConfigError, match=r"unknown group 'gpt' \(configured: kimi, llama\)"):
        config.group_servers("gpt")
    with pytest.raises(ConfigError, match="group 'llama' has no servers: add group"):
        config.group_servers("llama")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            ('group = "kimi"\n\n[servers.solo]', 'group = "kimii"\n\n[servers.solo]'),
            r"servers.b.group: no group 'kimii' is defined \(defined: kimi, llama\); add a "
            r"\[groups.kimii\] table",
        ),
        (
            ("max_concurrent_restarts = 2", "max_concurrent_restarts = 0"),
            "groups.kimi.max_concurrent_restarts: expected a whole number of at least 1",
        ),
        (
            ("max_concurrent_restarts = 2", "max_concurrent_restarts = 1.5"),
            "expected a whole number of at least 1",
        ),
        (
            ("max_concurrent_restarts = 2", "max_concurrent_restarts = true"),
            "expected a whole number of at least 1",
        ),
        (
            ("max_concurrent_restarts = 2", "max_restarts = 2"),
            r"groups.kimi: unknown key\(s\) max_restarts; allowed: "
            r"change_window, itl_p99_ms, max_concurrent_restarts",
        ),
        (
            ('group = "kimi"\n\n[servers.solo]', "group = 3\n\n[servers.solo]"),
            "servers.b.group: expected a non-empty string",
        ),
    ],
)
def test_mistakes_are_named(tmp_path: Path, edit: tuple[str, str], message: str) -> None:
    old, new = edit
    assert old in FLEET
    with pytest.raises(ConfigError, match=message):
        load(write(tmp_path, FLEET.replace(old, new, 1)))


def test_groups_must_be_tables(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"groups: expected tables like \[groups.NAME\]"):
        load(write(tmp_path, 'groups = 1\n[servers.a]\nurl = "http://10.0.0.1:30000"\n'))
    with pytest.raises(ConfigError, match=r"groups\.kimi: expected a table"):
        load(write(tmp_path, "groups = { kimi = 1 }\n"))
