"""`kvpilot serve` as systemd runs it: a real process, its exit status and its stderr.

A bot that cannot listen must not look alive: if it kept running after a failed bind, systemd
(and the operator) would take a process that never answers for a healthy one.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.bot.harness import twin_config
from tests.slackfake import FakeSlack
from tests.twin_process import REPO, free_port

SLACK = '[slack]\napprovers = ["U2"]\noperators = ["U1"]\n'


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with FakeSlack() as fake:
        yield fake


def serve_env(slack: FakeSlack, *, socket_mode: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLACK_")}
    env.update(
        SLACK_BOT_TOKEN="xoxb-test",
        SLACK_SIGNING_SECRET="test-signing-secret",
        SLACK_API_URL=slack.api_url,
    )
    if socket_mode:
        env["SLACK_APP_TOKEN"] = "xapp-1-test"
    return env


def spawn_serve(config: Path, port: int, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "bot.cli", "serve", "--config", str(config)),
            *("--host", "127.0.0.1", "--port", str(port)),
        ],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


@pytest.mark.parametrize("socket_mode", [False, True], ids=["http", "socket-mode-healthz"])
def test_serve_exits_at_once_when_its_port_is_taken(
    tmp_path: Path, slack: FakeSlack, socket_mode: bool
) -> None:
    config = twin_config(tmp_path, free_port(), slack=SLACK)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = spawn_serve(config, port, serve_env(slack, socket_mode=socket_mode))
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            stop(proc)
            out, err = proc.communicate()
            pytest.fail(f"kvpilot serve still ran 15 s after failing to listen:\n{err[-3000:]}")
    assert proc.returncode == 1, err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: cannot listen on 127.0.0.1:{port}: address already in use (is another "
        "kvpilot serve running? choose another --port)"
    ], err[-3000:]
    assert "listening" not in out + err and "Traceback" not in err
    # It failed before it did anything: no Slack connection, nothing sent.
    assert slack.calls() == []


def test_serve_logs_listening_only_once_the_port_accepts(tmp_path: Path, slack: FakeSlack) -> None:
    config = twin_config(tmp_path, free_port(), slack=SLACK)
    port = free_port()
    proc = spawn_serve(config, port, serve_env(slack, socket_mode=False))
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    try:
        seen: list[str] = []
        while True:
            line = lines.get(timeout=30)
            assert line is not None, "kvpilot serve exited:\n" + "".join(seen)[-3000:]
            seen.append(line)
            if "listening on" in line:
                break
        # One attempt, no retry: the line must not come before the socket is there.
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
        assert health.status_code == 200 and health.json()["mode"] == "http"
        assert f"listening on http://127.0.0.1:{port}" in seen[-1]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        stop(proc)
