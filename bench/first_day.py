"""`python -m bench.first_day`: an operator's first day, from a fresh clone to a first approved
experiment, following the README's quick start as written, against the local Slack-compatible
server and the twin; prints how long each step took and every message the operator reads.

What it adds to the README is only what points it at the local stand-ins (the tokens' values,
SLACK_API_URL, the twin for GPU-HOST:30000) and, for the experiment, what the quick start's last
step points to: a launcher (docs/launchers.md) so that kvpilot can restart the server. Each
message is checked for what a first day once met: lines glued together ("UTC*Trial*") and the
demo's story in a real server's messages.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.bot.harness import click_payload
from tests.bot.test_quick_start import SCALE, TWIN, blocks, commands, quick_start
from tests.ports import free_port
from tests.slackfake import FakeSlack
from tests.twin_process import REPO

CHANNEL, ALICE = "C0123OPS", "U0123ALICE"
GLUED = re.compile(r"[^\s*_(`\[]\*[A-Z][a-z]")  # a bold word glued to the word before it
STORY = re.compile(r"in the incident|SGLang needs")


class Day:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.began = time.monotonic()
        self.steps: list[tuple[str, float]] = []
        self.last = self.began

    def step(self, what: str) -> None:
        now = time.monotonic()
        self.steps.append((what, now - self.last))
        print(f"[{now - self.began:7.1f} s] {what} ({now - self.last:.1f} s)", flush=True)
        self.last = now


def sh(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    if done.returncode != 0 and "doctor" not in argv and "stop" not in argv:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout + done.stderr


def wait_for(slack: FakeSlack, needle: str, timeout: float) -> tuple[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for ts, m in slack.messages(CHANNEL).items():
            if needle in str(m.get("text")):
                return ts, m
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {needle!r}")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp, FakeSlack(outside=(CHANNEL,)) as slack:
        home = Path(tmp)
        day = Day(home)
        clone = home / "kvpilot"
        sh(["git", "clone", "-q", str(REPO), str(clone)], home)
        day.step("git clone")
        section = quick_start()
        (_, install), (_, exports), (_, toml), (_, doctor), (_, serve) = blocks(section)
        (venv_command,) = commands(install)
        sh(venv_command.split(), clone)  # make venv
        day.step("1. make venv")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "KVPILOT_"))}
        values = {"xoxb-...": "xoxb-test", "xapp-...": "xapp-1-test"}
        for line in commands(exports):
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = values[value]
        env["SLACK_API_URL"] = slack.api_url
        port = free_port()
        twin = [sys.executable, "-m", "sim.launch_server", "--port", str(port), *TWIN]
        config = clone / "kvpilot.toml"
        config.write_text(toml.replace("GPU-HOST:30000", f"127.0.0.1:{port}"))
        day.step("2-3. tokens and kvpilot.toml")
        server = subprocess.Popen(
            twin, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            return run_day(day, slack, clone, config, env, doctor, serve, twin, server)
        finally:
            server.kill()
            sh([str(clone / ".venv/bin/kvpilot"), "server", "stop", "--server", "kimi",
                "--config", str(config)], clone, env)  # fmt: skip


def run_day(
    day: Day, slack: FakeSlack, clone: Path, config: Path, env: dict[str, str], doctor: str,
    serve: str, twin: list[str], server: subprocess.Popen[bytes],
) -> int:  # fmt: skip
    kvpilot = str(clone / ".venv/bin/kvpilot")
    (check,) = commands(doctor)
    time.sleep(3)  # the twin starts
    first = sh([kvpilot, *check.split()[1:]], clone, env)
    print(first)
    # doctor's fixes, as a person applies them: the invite, and the twin's time scale
    slack.state.outside.discard(CHANNEL)
    if "set time_scale" in first:
        config.write_text(f"[kvpilot]\ntime_scale = {SCALE}\n\n" + config.read_text())
    again = sh([kvpilot, *check.split()[1:]], clone, env)
    print(again)
    day.step("4. kvpilot doctor, its fixes, kvpilot doctor")
    # the last step's pointer: a launcher, so kvpilot can restart the server (docs/launchers.md)
    server.kill()
    server.wait()
    config.write_text(
        config.read_text()
        + f'\n[servers.kimi.launcher]\nkind = "process"\ncommand = {json.dumps(twin)}\n'
    )
    sh([kvpilot, "server", "start", "--server", "kimi", "--config", str(config)], clone, env)
    day.step("6'. a process launcher, and kvpilot server start")
    (start,) = commands(serve)
    bot = subprocess.Popen([kvpilot, *start.split()[1:]], cwd=clone, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        slack.socket_wait_connections(1, timeout=60)
        day.step("5. kvpilot serve, connected")
        slack.socket_wait_ack(slack.socket_send("slash_commands", {
            "command": "/kvpilot", "text": "diagnose kimi", "user_id": ALICE,
            "channel_id": CHANNEL, "team_id": "T1", "trigger_id": "1",
            "response_url": slack.response_url("diagnose")}))  # fmt: skip
        ts, diagnosis = wait_for(slack, "Diagnosis of kimi", 300)
        day.step("6. /kvpilot diagnose kimi: the diagnosis")
        value = next(
            e["value"] for b in diagnosis.get("blocks", []) for e in b.get("elements", [])
            if e.get("action_id", "").startswith("kvpilot.propose")
        )  # fmt: skip
        click(slack, "kvpilot.propose#0", value, ts)
        ts, approval = wait_for(slack, "Change proposed for kimi", 60)
        day.step("7. Propose: the approval message")
        approve = next(
            e["value"] for b in approval.get("blocks", []) for e in b.get("elements", [])
            if e.get("action_id") == "kvpilot.approve"
        )  # fmt: skip
        click(slack, "kvpilot.approve", approve, ts)
        wait_for(slack, "Experiment 1 on kimi: ", 900)
        day.step("8. Approve: the experiment and its verdict")
    finally:
        bot.terminate()
        bot.wait(timeout=60)
    return report(day, slack)


def click(slack: FakeSlack, action_id: str, value: str, ts: str) -> None:
    payload = click_payload(slack, action_id, value, ALICE, ts, CHANNEL)
    slack.socket_wait_ack(slack.socket_send("interactive", payload))


def report(day: Day, slack: FakeSlack) -> int:
    print("\nsteps:")
    for what, took in day.steps:
        print(f"  {took:7.1f} s  {what}")
    print(f"  {sum(t for _, t in day.steps):7.1f} s  in all\n\nwhat the operator read:")
    texts = [str(m.get("text")) for m in slack.messages(CHANNEL).values()]
    texts += [str(e.get("text")) for e in slack.ephemerals()]
    bad = 0
    for text in texts:
        print("-" * 72 + "\n" + text)
        for found in (*GLUED.findall(text), *STORY.findall(text)):
            print(f"  !! {found!r}")
            bad += 1
    print(f"\n{len(texts)} messages, {bad} garbled or carrying the demo's story")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
