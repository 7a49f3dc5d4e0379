"""Latency targets in kvpilot.toml: per server or per group, checked, carried in GateSettings."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.app.config import ConfigError, load

FLEET = """
[groups.kimi]
itl_p99_ms = 50
ttft_p99_s = 3

[servers.a]
url = "http://10.0.0.1:30000"
group = "kimi"

[servers.b]
url = "http://10.0.0.2:30000"
group = "kimi"
itl_p99_ms = 35

[servers.solo]
url = "http://10.0.0.3:30000"
ttft_p99_s = 1.5
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "kvpilot.toml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("server", "ttft_p99_s", "itl_p99_ms"),
    [
        ("a", 3.0, 50.0),  # both from its group
        ("b", 3.0, 35.0),  # its own ITL target wins, the group's TTFT target stays
        ("solo", 1.5, None),  # no group: only what it sets
    ],
)
def test_targets_are_inherited_key_by_key(
    tmp_path: Path, server: str, ttft_p99_s: float | None, itl_p99_ms: float | None
) -> None:
    gate = load(write(tmp_path, FLEET)).server(server).gate
    assert (gate.ttft_p99_s, gate.itl_p99_ms) == (ttft_p99_s, itl_p99_ms)


def test_without_targets_the_gate_has_none(tmp_path: Path) -> None:
    gate = load(write(tmp_path, '[servers.x]\nurl = "http://10.0.0.9:30000"\n')).server("x").gate
    assert gate.ttft_p99_s is None and gate.itl_p99_ms is None


@pytest.mark.parametrize(
    ("line", "where", "message"),
    [
        ('itl_p99_ms = "fast"', "servers", "servers.solo.itl_p99_ms: expected a number of milli"),
        ("itl_p99_ms = true", "servers", "servers.solo.itl_p99_ms: expected a number"),
        ("ttft_p99_s = 0", "servers", "servers.solo.ttft_p99_s: must be a positive number of sec"),
        ("itl_p99_ms = -5", "groups", "groups.kimi.itl_p99_ms: must be a positive number of milli"),
        ("ttft_p99_s = inf", "groups", "groups.kimi.ttft_p99_s: must be a positive number"),
        ("itl_p99_ms = 0.05", "servers", r"in milliseconds: for 50 ms write itl_p99_ms = 50"),
        ("ttft_p99_s = 500", "groups", r"in seconds: for 500 ms write ttft_p99_s = 0.5"),
        (
            "ttft_p99 = 2",
            "servers",
            r"servers.solo: unknown key\(s\) ttft_p99; allowed: .*ttft_p99_s",
        ),
        ("itl_p99 = 2", "groups", r"groups.kimi: unknown key\(s\) itl_p99; allowed: .*itl_p99_ms"),
    ],
)
def test_bad_targets_say_what_is_wrong_and_how_to_fix_it(
    tmp_path: Path, line: str, where: str, message: str
) -> None:
    plain = '[groups.kimi]\n\n[servers.solo]\nurl = "http://10.0.0.3:30000"\ngroup = "kimi"\n'
    anchor = "[servers.solo]\n" if where == "servers" else "[groups.kimi]\n"
    text = plain.replace(anchor, anchor + line + "\n")
    with pytest.raises(ConfigError, match=message):
        load(write(tmp_path, text))
