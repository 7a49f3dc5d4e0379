"""`kvpilot doctor` against the local Slack-compatible server and the twin: each thing wrong
is named with its fix and the exit status is 1; all well, 0. It writes nothing."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.cli import main
from bot.slack.doctor import REQUIRED_SCOPES
from tests.paths import REPO
from tests.ports import free_port
from tests.slackfake import FakeSlack
from tests.twin_process import TwinProcess, running_twin


@pytest.fixture(scope="module")
def twin() -> Iterator[TwinProcess]:
    with running_twin(["--time-scale", "300", "--enable-metrics", "--api-key", "sekrit"]) as t:
        yield t


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with FakeSlack() as s:
        yield s


def write(tmp_path: Path, twin: TwinProcess, *, key: str = "sekrit", extra: str = "") -> Path:
    config = tmp_path / "kvpilot.toml"
    config.write_text(
        "[kvpilot]\ntime_scale = 300\n\n"  # the twin's (`twin` below)
        '[slack]\napprovers = ["U1"]\nchannels = ["C0OPS"]\n\n'
        f'[servers.kimi]\nurl = "{twin.url}"\napi_key = "{key}"\n' + extra
    )
    return config


def doctor(config: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, Any]:
    for k in ("SLACK_BOT_TOKEN", "SLACK_API_URL", "SLACK_APP_TOKEN", "SLACK_SIGNING_SECRET"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    out, err = io.StringIO(), io.StringIO()
    code = main(["doctor", "--config", str(config), "--json"], out=out, err=err)
    return code, json.loads(out.getvalue())


# Socket Mode's app-level token, as `serve` needs it without a signing secret
SOCKET = {"SLACK_APP_TOKEN": "xapp-1-A1-1-abc"}


def fails_with(
    config: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch, expect: str
) -> None:
    """doctor exits 1 and one of its failures (area: detail | fix) matches `expect`."""
    code, report = doctor(config, env, monkeypatch)
    assert code == 1 and not report["ok"]
    found = failures(report)
    assert any(re.search(expect, f) for f in found), found


def failures(report: Any) -> list[str]:
    return [f"{c['area']}: {c['detail']} | {c['fix']}" for c in report["checks"] if not c["ok"]]


def test_all_well_exits_0_and_writes_nothing(
    tmp_path: Path, twin: TwinProcess, slack: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write(tmp_path, twin)
    env = {"SLACK_BOT_TOKEN": "xoxb-test", "SLACK_API_URL": slack.api_url, **SOCKET}
    code, report = doctor(config, env, monkeypatch)
    assert code == 0 and report["ok"], failures(report)
    assert any("Socket Mode" in c["detail"] for c in report["checks"]), report
    # HTTP mode instead: the signing secret is what serve needs
    http = {**env, "SLACK_APP_TOKEN": "", "SLACK_SIGNING_SECRET": "s3cret"}
    code, report = doctor(config, http, monkeypatch)
    assert code == 0 and report["ok"], failures(report)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kvpilot.toml"]  # no database made
    assert slack.calls("chat.postMessage") == []


@pytest.mark.parametrize(
    ("case", "expect"),
    [
        ("revoked token", r"slack: Slack refused SLACK_BOT_TOKEN \(token_revoked\) \| .*reinstall"),
        ("app token given", r"slack: .*SLACK_BOT_TOKEN \(invalid_auth\) \| .*set SLACK_BOT_TOKEN"),
        ("no token", r"slack: .*SLACK_BOT_TOKEN is not set \| export SLACK_BOT_TOKEN"),
        ("not in the channel", r"slack: kvpilot is not in #c0ops \(C0OPS\).* \| invite it: "),
        ("private channel", r"slack: channel G0OPS is not found: .* private .* \| check the ID"),
        (
            "missing scope",
            r"slack: the app lacks the scope\(s\) channels:read, groups:read, im:write \| add",
        ),
        ("wrong API key", r"server kimi: .*(API key|api_key|401)"),
        ("server down", r"server kimi: .*127\.0\.0\.1:\d+.* \| check the url"),
        ("unwritable database", r"database: .* cannot be created: .* \| set \[kvpilot\] database"),
    ],
)
def test_each_thing_wrong_is_named_with_its_fix(
    tmp_path: Path,
    twin: TwinProcess,
    slack: FakeSlack,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    expect: str,
) -> None:
    env = {"SLACK_BOT_TOKEN": "xoxb-test", "SLACK_API_URL": slack.api_url, **SOCKET}
    config = write(tmp_path, twin)
    if case == "revoked token":
        slack.fail_next("auth.test", error="token_revoked")
    elif case == "app token given":
        env["SLACK_BOT_TOKEN"] = "xapp-1-A1-1-abc"  # the Socket Mode token, not the bot's
    elif case == "no token":
        env = {}
    elif case == "not in the channel":
        slack.state.outside.add("C0OPS")
    elif case == "private channel":
        config.write_text(config.read_text().replace("C0OPS", "G0OPS"))
        slack.state.outside.add("G0OPS")
        slack.state.private.add("G0OPS")
    elif case == "missing scope":
        slack.state.scopes = ("commands", "chat:write", "files:write", "usergroups:read")
    elif case == "wrong API key":
        config = write(tmp_path, twin, key="wrong")
    elif case == "server down":
        text = config.read_text().replace(twin.url, f"http://127.0.0.1:{free_port()}")
        config.write_text(text)
    elif case == "unwritable database":
        (tmp_path / "file").write_text("x")
        config.write_text(
            config.read_text().replace(
                "[kvpilot]\n", f'[kvpilot]\ndatabase = "{tmp_path}/file/db/kvpilot.db"\n', 1
            )
        )
    fails_with(config, env, monkeypatch, expect)


@pytest.mark.parametrize(
    ("case", "expect"),
    [
        # what `serve` needs besides the bot token: doctor passed, then serve exited 2
        ("no app token nor signing secret", r"slack: HTTP mode needs SLACK_SIGNING_SECRET"),
        ("bot token as the app token", r"slack: SLACK_APP_TOKEN must be an app-level token"),
        ("app token refused", r"slack: Slack refused SLACK_APP_TOKEN \(invalid_auth\) \| "),
        # a directory SQLite cannot create a file in, although every permission bit says yes
        ("database under /proc", r"database: /proc/kvpilot/kvpilot.db cannot be created"),
        ("database is a directory", r"database: .* is a directory \| name a file in it"),
        # the twin runs 300x faster than real time: every rate read on the wall clock would be
        # 300 times too high, as Slack once showed ("effective 168,019.6 tok/s")
        (
            "time scale missing",
            r"server kimi: .*runs 300 times faster than real time.*\| set time_scale = 300",
        ),
    ],
)
def test_what_serve_needs_fails_doctor_too(
    tmp_path: Path,
    twin: TwinProcess,
    slack: FakeSlack,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    expect: str,
) -> None:
    env = {"SLACK_BOT_TOKEN": "xoxb-test", "SLACK_API_URL": slack.api_url, **SOCKET}
    config = write(tmp_path, twin)
    database = {
        "database under /proc": "/proc/kvpilot/kvpilot.db",
        "database is a directory": str(tmp_path),
    }
    if case == "no app token nor signing secret":
        del env["SLACK_APP_TOKEN"]
    elif case == "bot token as the app token":
        env["SLACK_APP_TOKEN"] = "xoxb-test"
    elif case == "app token refused":
        slack.fail_next("apps.connections.open", error="invalid_auth")
    elif case == "time scale missing":  # the twin announces 300x; the configuration says nothing
        config.write_text(config.read_text().replace("time_scale = 300\n", ""))
    else:
        config.write_text(
            config.read_text().replace(
                "[kvpilot]\n", f'[kvpilot]\ndatabase = "{database[case]}"\n', 1
            )
        )
    fails_with(config, env, monkeypatch, expect)


def test_the_scopes_checked_are_the_manifests() -> None:
    manifest = (REPO / "deploy" / "slack" / "manifest.yaml").read_text()
    bot = manifest.split("bot:", 1)[1].split("settings:", 1)[0]
    assert tuple(re.findall(r"^\s+- ([\w:.]+)", bot, re.MULTILINE)) == REQUIRED_SCOPES


def test_serve_refuses_to_start_on_a_token_slack_refuses(
    tmp_path: Path, twin: TwinProcess, slack: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check doctor makes of the token is made at every start: a revoked token stops the
    bot at once with the fix, instead of at its first post."""
    config = write(tmp_path, twin)
    for k, v in {
        "SLACK_BOT_TOKEN": "xoxb-test",
        "SLACK_API_URL": slack.api_url,
        "SLACK_SIGNING_SECRET": "secret",
    }.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SLACK_APP_TOKEN", raising=False)
    slack.fail_next("auth.test", error="token_revoked")
    out, err = io.StringIO(), io.StringIO()
    code = main(["serve", "--config", str(config), "--port", str(free_port())], out=out, err=err)
    assert code == 2
    assert "slack: Slack refused SLACK_BOT_TOKEN (token_revoked). Fix: " in err.getvalue()
    assert "reinstall the app" in err.getvalue()
    assert not (tmp_path / "var").exists()  # nothing started, nothing written
