"""Socket Mode, settings validation, the terminal front end, and the pure parts."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.app.config import ConfigError, load, parse
from bot.chat.commands import CommandError, parse_command
from bot.chat.messages import Button, Message, parse_parts
from bot.cli import main as cli
from bot.console.terminal import Console
from bot.slack.blocks import blocks as slack_blocks
from bot.slack.identity import SLACK as SLACK_IDS
from bot.slack.serve import SettingsError, slack_settings
from playbooks.engines.sglang import rules as sglang_rules
from playbooks.experiments.ownership import start_mark
from storage import experiments as store
from storage import proposals
from storage.db import open_db
from tests.bot.harness import CHANNEL, running_bot, twin_config, wait_until
from tests.ports import free_port
from tests.slackfake import FakeSlack
from tests.slackfake.blocks import block_problems
from tests.twin_process import REPO

SLACK = '[slack]\napprovers = ["U2"]\noperators = ["U1"]\n'


@pytest.fixture
def config(tmp_path: Path) -> Iterator[Path]:
    path = twin_config(tmp_path, free_port(), slack=SLACK)
    out, err = io.StringIO(), io.StringIO()
    assert cli(["server", "start", "--server", "incident", "--config", str(path)], out, err) == 0
    try:
        yield path
    finally:
        cli(["server", "stop", "--server", "incident", "--config", str(path)], out, err)


def test_socket_mode_end_to_end(config: Path) -> None:
    with FakeSlack() as slack, running_bot(config, slack, app_token="xapp-1-test") as _:
        slack.socket_wait_connections(1)
        env = slack.socket_send(
            "slash_commands",
            {"command": "/kvpilot", "text": "help", "user_id": "U1", "channel_id": CHANNEL,
             "team_id": "T1", "response_url": slack.response_url("h"), "trigger_id": "1"},
        )  # fmt: skip
        ack = slack.socket_wait_ack(env)
        assert "/kvpilot diagnose" in ack["payload"]["text"]
        env = slack.socket_send(
            "slash_commands",
            {"command": "/kvpilot", "text": "status", "user_id": "U1", "channel_id": CHANNEL,
             "team_id": "T1", "response_url": slack.response_url("s"), "trigger_id": "2"},
        )  # fmt: skip
        slack.socket_wait_ack(env)
        status = slack.wait_for("chat.postMessage")[0]
        assert "incident" in status.params["text"] and "healthy" in status.params["text"]
        assert "sampler running" in status.params["text"]
        env = slack.socket_send(
            "slash_commands",
            {"command": "/kvpilot", "text": "report --since 1h", "user_id": "U1",
             "channel_id": CHANNEL, "team_id": "T1", "response_url": slack.response_url("r"),
             "trigger_id": "3"},
        )  # fmt: skip
        assert "Building the report" in slack.socket_wait_ack(env)["payload"]["text"]
        slack.wait_for("files.completeUploadExternal", timeout=30)
        report = slack.wait_for("chat.postMessage", 2)[1]
        assert "incident" in report.params["text"]
        assert slack.files[0].content.startswith(b"\x89PNG") and slack.files[0].thread_ts
        assert not slack.violations


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({}, "SLACK_BOT_TOKEN is not set"),
        ({"SLACK_BOT_TOKEN": "abc"}, "starting with xoxb-"),
        ({"SLACK_BOT_TOKEN": "xoxb-1"}, "needs SLACK_SIGNING_SECRET"),
        ({"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xoxb-2"}, "starting with xapp-"),
        ({"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1", "SLACK_API_URL": "ftp://x"},
         "http(s) URL"),
    ],
)  # fmt: skip
def test_bad_settings_fail_at_start(env: dict[str, str], needle: str) -> None:
    with pytest.raises(SettingsError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        slack_settings(env)


def test_serve_without_slack_section_says_what_to_add(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = twin_config(tmp_path, free_port())
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-1")
    monkeypatch.setenv("SLACK_SIGNING_SECRET", "s")
    out, err = io.StringIO(), io.StringIO()
    assert cli(["serve", "--config", str(path)], out, err) == 2
    assert "no [slack] section" in err.getvalue() and "Traceback" not in err.getvalue()


def test_console_proposes_and_rejects_interactively(config: Path) -> None:
    out = io.StringIO()
    stdin = io.StringIO("2\ny\n")  # choose "Reject", confirm
    console = Console(load(str(config)), out=out, stdin=stdin, auto=False, user="ops")
    try:
        console.loop(["propose incident mem_fraction_static=0.88", "history"])
    finally:
        console.flow.close()
    text = out.getvalue()
    assert "Change proposed for incident" in text and "[2] Reject" in text
    assert "Rejected by console:ops" in text and "No experiments yet" in text
    db = open_db(config.parent / "var" / "kvpilot.db")
    assert proposals.approvals(db, 1)[0].decision == "rejected"


def console_process(
    config: Path, *commands: str, yes: bool = False
) -> subprocess.CompletedProcess[str]:
    """`kvpilot console` as cron, CI or `ssh host kvpilot console` run it: stdin is no terminal."""
    argv = [sys.executable, "-m", "bot.cli", "console", "--config", str(config)]
    for command in commands:
        argv += ["-c", command]
    return subprocess.run(
        argv + (["--yes"] if yes else []),
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
    )


def server_identity(config: Path) -> dict[str, Any]:
    """What a restart would change: the process (pid and start time) and its arguments."""
    out, err = io.StringIO(), io.StringIO()
    assert (
        cli(
            ["server", "status", "--server", "incident", "--config", str(config), "--json"],
            out,
            err,
        )
        == 0
    )
    state = json.loads(out.getvalue())
    url = load(str(config)).server("incident").url
    info = httpx.get(url + "/server_info", timeout=5).json()
    return {
        "pid": state["pid"],
        "created": start_mark(state["pid"]),  # not moved by a step of the wall clock
        "args": state["args"],
        "mem_fraction_static": info["mem_fraction_static"],
        "startup_time": info.get("startup_time"),
    }


@pytest.mark.parametrize(
    "command", ["propose incident mem_fraction_static=0.88", "diagnose incident"]
)
def test_console_without_a_terminal_refuses_to_choose(config: Path, command: str) -> None:
    before = server_identity(config)
    done = console_process(config, command)
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: confirmation needed and there is no terminal: re-run in a terminal or with "
        "--yes to approve what kvpilot recommends"
    ], done.stderr[-3000:]
    assert "auto:" not in done.stdout and "Traceback" not in done.stderr
    assert store.list_experiments(open_db(config.parent / "var" / "kvpilot.db")) == []
    assert server_identity(config) == before


def test_console_without_a_terminal_runs_read_only_commands(config: Path) -> None:
    done = console_process(config, "status", "history", "help")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "healthy" in done.stdout and "No experiments yet" in done.stdout
    assert "error" not in done.stderr


@pytest.mark.slow
def test_console_with_yes_approves_the_change_without_a_terminal(config: Path) -> None:
    done = console_process(config, "propose incident mem_fraction_static=0.88", yes=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "auto: Approve (--yes approves what kvpilot recommends)" in done.stdout
    rows = store.list_experiments(open_db(config.parent / "var" / "kvpilot.db"))
    assert len(rows) == 1 and rows[0].terminal


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_in_the_console_aborts_its_experiment_and_reverts(
    config: Path, signum: signal.Signals
) -> None:
    # a long warm-up holds the changed server in a measuring state no verdict can end first
    config.write_text(config.read_text().replace("[gate]\n", "[gate]\nwarmup_s = 6000\n", 1))
    argv = [sys.executable, "-m", "bot.cli", "console", "--config", str(config), "--yes"]
    argv += ["-c", "propose incident mem_fraction_static=0.88"]
    proc = subprocess.Popen(
        argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    path = config.parent / "var" / "kvpilot.db"

    def in_state(state: str) -> bool:
        assert proc.poll() is None, proc.communicate()
        rows = store.list_experiments(open_db(path)) if path.exists() else []
        return bool(rows) and str(rows[0].state) == state

    try:
        wait_until(lambda: in_state("warming_up"), 90, "the warm-up")
        proc.send_signal(signum)
        wait_until(lambda: in_state("reverting"), 30, "the revert")
        proc.send_signal(signal.SIGINT)  # a second one does not stop the revert
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 6, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert f"{signal.Signals(signum).name}: aborting experiment 1" in err
    assert "still under way" in err and "kvpilot resume" in err
    (row,) = store.list_experiments(open_db(path))
    assert str(row.state) == "reverted"
    moves = store.transitions(open_db(path), row.id)
    assert any(m.to_state == "reverting" and m.actor.startswith("console:") for m in moves)
    assert server_identity(config)["mem_fraction_static"] == 0.85


def test_commands_are_validated_with_hints(tmp_path: Path) -> None:
    config = parse(
        {"servers": {"a": {"url": "http://h:1"}, "b": {"url": "http://h:2"}}}, tmp_path / "k.toml"
    )
    assert parse_command("", config).name == "help"
    assert parse_command("propose a mem_fraction_static=0.9 --force", config).force
    for text, needle in [
        ("frobnicate", "unknown command"),
        ("diagnose", "which server?"),
        ("diagnose c", "unknown server"),
        ("propose a", "nothing to change"),
        ("propose a chunked_prefill_size=abc", "whole number"),
        ("abort x", "usage"),
        ('diagnose "a', "quotes"),
    ]:
        with pytest.raises(CommandError, match=needle):
            parse_command(text, config)
    with pytest.raises(ConfigError, match="not a Slack ID"):
        parse({"slack": {"approvers": ["alice@example.com"]}}, tmp_path / "k.toml", ids=SLACK_IDS)


def test_long_messages_stay_within_block_kit_limits() -> None:
    body = "\n".join(f"line {i} " + "x" * 80 for i in range(200))
    parts = tuple(["# " + "H" * 300] + [body] * 30)
    buttons = tuple(Button(f"kvpilot.propose#{i}", f"1:{i}", "B" * 100) for i in range(12))
    msg = Message(text="t", buttons=buttons, parts=parse_parts(parts))
    blocks = slack_blocks(msg)
    assert len(blocks) <= 50 and block_problems(blocks, msg.text) == []
    wait_until(lambda: True)


def test_manifest_declares_what_the_bot_uses() -> None:
    import yaml  # noqa: PLC0415

    from bot.slack.app import COMMAND  # noqa: PLC0415
    from tests.twin_process import REPO  # noqa: PLC0415

    manifest = yaml.safe_load((REPO / "deploy" / "slack" / "manifest.yaml").read_text())
    assert [c["command"] for c in manifest["features"]["slash_commands"]] == [COMMAND]
    assert manifest["settings"]["interactivity"]["is_enabled"] is True
    scopes = set(manifest["oauth_config"]["scopes"]["bot"])
    # Every Web API method the bot calls, and the scope Slack requires for it.
    needs = {
        "chat.postMessage": "chat:write",
        "chat.update": "chat:write",
        "chat.postEphemeral": "chat:write",
        "files.getUploadURLExternal": "files:write",
        "files.completeUploadExternal": "files:write",
        "usergroups.users.list": "usergroups:read",
        # kvpilot doctor: public channels, private ones
        "conversations.info": "channels:read",
        "conversations.info (private)": "groups:read",
        # approvers' direct messages, the Home tab's answers
        "conversations.open": "im:write",
        "views.publish": "",  # no scope; the Home tab must be on, and app_home_opened heard
    }
    assert set(needs.values()) - {""} | {"commands"} == scopes
    assert manifest["features"]["app_home"]["home_tab_enabled"] is True
    assert "app_home_opened" in manifest["settings"]["event_subscriptions"]["bot_events"]
    source = "\n".join(
        (REPO / "bot" / name).read_text()
        for name in (
            "slack/app.py", "slack/surface.py", "slack/serve.py", "slack/doctor.py", "chat/flow.py",
            "slack/home.py",
        )
    )  # fmt: skip
    for method in (
        "chat_postMessage", "chat_update", "chat_postEphemeral", "files_upload_v2",
        "conversations_info", "usergroups_users_list", "conversations_open", "views_publish",
    ):  # fmt: skip
        assert method in source


# An engine that cannot reason about a server (its `rules_for` raises ValueError, as the
# interface allows) makes a proposal fail with a sentence, not a traceback, and records nothing.
def test_an_engine_without_rules_refuses_the_proposal_in_words(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_rules(*_args: Any, **_kwargs: Any) -> Any:
        raise ValueError("this engine cannot judge a change on this server")

    monkeypatch.setattr(sglang_rules, "rules_for", no_rules)
    out = io.StringIO()
    console = Console(load(str(config)), out=out, stdin=io.StringIO(""), auto=False, user="ops")
    try:
        console.loop(["propose incident mem_fraction_static=0.88"])
    finally:
        console.flow.close()
    text = out.getvalue()
    assert "Cannot propose a change to `incident`" in text, text
    assert "this engine cannot judge a change on this server" in text
    assert "Traceback" not in text
    db = open_db(config.parent / "var" / "kvpilot.db")
    assert not db["proposals"].exists() or db["proposals"].count == 0
