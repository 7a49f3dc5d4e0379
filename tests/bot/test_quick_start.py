"""The README's quick start, followed step by step as written: its commands and its
configuration are read from the README itself, and run against the local Slack-compatible
server and the twin, up to the diagnosis posted in the channel.

What the test adds is only what points the steps at the local stand-ins: the tokens' values,
SLACK_API_URL, the twin's address for GPU-HOST:30000, and the twin's time scale.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.slackfake import FakeSlack
from tests.twin_process import REPO, running_twin

SCALE = 200
TWIN = [
    "--preset", "kimi-k2.5-rtxpro6000-tp8", "--mem-fraction-static", "0.85", "--enable-metrics",
    "--time-scale", str(SCALE), "--workload", "incident", "--concurrency", "150",
]  # fmt: skip


def quick_start() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("## Quick start")
    return text[start : text.index("\n## ", start + 1)]


def blocks(section: str) -> list[tuple[str, str]]:
    """The fenced blocks in order: (language, text without the list item's indentation)."""
    found = re.findall(r"^( *)```(\w+)\n(.*?)^\1```", section, re.MULTILINE | re.DOTALL)
    return [
        (lang, "\n".join(line[len(indent) :] for line in body.splitlines()))
        for indent, lang, body in found
    ]


def commands(body: str) -> list[str]:
    return [line.split("  #", 1)[0].strip() for line in body.splitlines() if line.strip()]


def run(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A README command as a person runs it in the directory of their kvpilot.toml."""
    argv = command.split()
    if argv[0] == ".venv/bin/kvpilot":
        argv = [sys.executable, "-m", "bot.cli", *argv[1:]]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_readme_quick_start_reaches_a_diagnosis_in_the_channel(tmp_path: Path) -> None:
    section = quick_start()
    steps = blocks(section)
    assert [lang for lang, _ in steps] == ["bash", "bash", "toml", "bash", "bash"], steps
    (_, install), (_, exports), (_, toml), (_, doctor), (_, serve) = steps
    assert commands(install) == ["make venv"]  # the environment this test runs in
    slash = re.findall(r"type `/kvpilot ([^`]+)`", section)
    assert slash == ["diagnose kimi"], slash
    with FakeSlack(outside=("C0123OPS",)) as slack, running_twin(TWIN) as twin:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "KVPILOT_"))}
        values = {"xoxb-...": "xoxb-test", "xapp-...": "xapp-1-test"}
        for line in commands(exports):
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = values[value]
        env["SLACK_API_URL"] = slack.api_url
        config = toml.replace("GPU-HOST:30000", twin.url.removeprefix("http://"))
        (tmp_path / "kvpilot.toml").write_text(f"[kvpilot]\ntime_scale = {SCALE}\n\n{config}")

        (check,) = commands(doctor)
        first = run(check, tmp_path, env)
        assert first.returncode == 1, first.stdout + first.stderr
        assert "FAIL slack: kvpilot is not in #c0123ops (C0123OPS)" in first.stdout
        assert "fix: invite it: type /invite @kvpilot in that channel" in first.stdout
        slack.state.outside.discard("C0123OPS")  # /invite @kvpilot
        again = run(check, tmp_path, env)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "FAIL" not in again.stdout
        assert list(tmp_path.iterdir()) == [tmp_path / "kvpilot.toml"]  # doctor wrote nothing

        (start,) = commands(serve)
        argv = [sys.executable, "-m", "bot.cli", *start.split()[1:]]
        log = (tmp_path / "serve.log").open("w")
        bot = subprocess.Popen(
            argv, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            start_new_session=True,
        )  # fmt: skip
        try:
            slack.socket_wait_connections(1, timeout=60)
            envelope = slack.socket_send(
                "slash_commands",
                {"command": "/kvpilot", "text": slash[0], "user_id": "U0123ALICE",
                 "channel_id": "C0123OPS", "team_id": "T1", "trigger_id": "1",
                 "response_url": slack.response_url("diagnose")},
            )  # fmt: skip
            slack.socket_wait_ack(envelope)
            deadline = time.monotonic() + 120
            while not any(
                "Diagnosis of kimi" in str(m.get("text"))
                for m in slack.messages("C0123OPS").values()
            ):
                assert bot.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
                assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
                time.sleep(0.1)
            bot.send_signal(signal.SIGTERM)
            assert bot.wait(timeout=30) == 0
        finally:
            if bot.poll() is None:
                os.killpg(bot.pid, signal.SIGKILL)
                bot.wait(timeout=10)
            log.close()
        diagnosis = next(
            m for m in slack.messages("C0123OPS").values() if "Diagnosis of kimi" in str(m["text"])
        )
        assert "kv cache bound" in str(diagnosis["text"]).lower(), diagnosis["text"]
        assert slack.violations == []
