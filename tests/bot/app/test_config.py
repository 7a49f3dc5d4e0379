"""Configuration: the minimal file works, and every mistake is named with its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.app.config import ConfigError, load

MINIMAL = """
[servers.incident]
url = "http://127.0.0.1:30000"
[servers.incident.launcher]
kind = "process"
command = ["python", "-m", "sim.launch_server", "--preset", "kimi-k2.5-rtxpro6000-tp8",
           "--port", "30000", "--mem-fraction-static", "0.85", "--enable-metrics"]
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "kvpilot.toml"
    path.write_text(text)
    return str(path)


def test_minimal_file(tmp_path: Path) -> None:
    config = load(write(tmp_path, MINIMAL))
    server = config.server("incident")
    assert server.url == "http://127.0.0.1:30000"
    assert server.launcher is not None and server.launcher.command[2] == "sim.launch_server"
    assert server.gate.min_effect == 0.03 and config.time_scale == 1.0
    assert config.database == tmp_path / "var" / "kvpilot.db"


def test_environment_variable_and_default_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, MINIMAL)
    monkeypatch.setenv("KVPILOT_CONFIG", path)
    assert "incident" in load().servers
    monkeypatch.delenv("KVPILOT_CONFIG")
    monkeypatch.chdir(tmp_path)
    assert "incident" in load().servers


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[servers.a]\nurl = 'localhost:1'\n", "servers.a.url: expected http://HOST:PORT"),
        ("[servers.a]\nurl = 'http://x'\nport = 3\n", "servers.a: unknown key(s) port"),
        (
            "[servers.a]\nurl = 'http://x'\n[servers.a.launcher]\nkind = 'nomad'\n"
            "command = ['x']\n",
            "is not a known launcher",
        ),
        (
            "[servers.a]\nurl = 'http://x'\n[servers.a.launcher]\ncommand = ['x']\n",
            'servers.a.launcher.kind: missing; say how kvpilot restarts it: one of "process"',
        ),
        (
            "[servers.a]\nurl = 'http://x'\n[servers.a.launcher]\nkind = 'process'\n"
            "command = 'x'\n",
            "expected a list of strings",
        ),
        ("[gate]\nmin_effect = 'big'\n", "gate.min_effect: expected a number"),
        ("[gate]\nbatch_s = 4\nscrape_s = 5\n", "must hold at least two scrapes"),
        ("[gate]\nmax_trial_s = 30\n", "max_trial_s must leave room"),
        ("[kvpilot]\ntime_scale = -1\n", "kvpilot.time_scale: must be positive"),
        ("[kvpilot]\ntime_scale = nan\n", "kvpilot.time_scale: expected a finite number"),
        ("[kvpilot]\ntime_scale = inf\n", "kvpilot.time_scale: expected a finite number"),
        ("[servers.a]\nurl = 'http://[::1'\n", "servers.a.url: 'http://[::1' is not an http"),
        ("[servers.a]\nurl = 'http://h:99999'\n", "servers.a.url: 'http://h:99999' has no valid"),
        ("[access]\napproval_ttl = '99999999999w'\n", "at most 3650 days"),
        ("[servers.'kimi 7']\nurl = 'http://x:1'\n", "a server's name is one word"),
        ("[servers.'']\nurl = 'http://x:1'\n", "a server's name is one word"),
        (
            "[servers.a]\nurl = 'http://x'\napi_key_env = 'KVPILOT_NOPE_UNSET'\n",
            "KVPILOT_NOPE_UNSET is not set",
        ),
        ("this is not toml", "is not valid TOML"),
    ],
)
def test_errors_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=None) as exc:
        load(write(tmp_path, text))
    assert message in str(exc.value)


def test_missing_file_and_unknown_server(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no configuration at"):
        load(str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match="unknown server 'other'"):
        load(write(tmp_path, MINIMAL)).server("other")


def test_baseline_must_hold_six_batches(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="baseline_s: needs at least six batches"):
        load(write(tmp_path, "[gate]\nbaseline_s = 60\nbatch_s = 30\n"))
