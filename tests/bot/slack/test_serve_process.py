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
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.bot.harness import SlackDriver, twin_config
from tests.bot.reports.fake_sglang import fake_sglang
from tests.faults.entry import FAULTY_CLI
from tests.ports import free_port
from tests.slackfake import FakeSlack
from tests.twin_process import REPO

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


def spawn_serve(
    config: Path, port: int, env: dict[str, str], *, log: Path | None = None
) -> subprocess.Popen[str]:
    """`kvpilot serve` on `port`; its stderr to `log` when given (a process that runs for
    long must not block on a pipe the test reads only at the end), else to a pipe."""
    command = [
        *(sys.executable, "-m", "bot.cli", "serve", "--config", str(config)),
        *("--host", "127.0.0.1", "--port", str(port)),
    ]
    if log is not None:
        with log.open("a") as sink:  # the child keeps its own descriptor
            return subprocess.Popen(
                command, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink,
                text=True, start_new_session=True,
            )  # fmt: skip
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


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
    """It also runs doctor's checks first: what is not fatal (the server is down, a channel to
    join) is logged with its fix, and the bot starts."""
    slack.state.outside.add("C0OPS")
    config = twin_config(tmp_path, free_port(), slack=SLACK + 'channels = ["C0OPS"]\n')
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
        warned = [line for line in seen if "start-up check failed" in line]
        assert len(warned) == 2, seen
        slack_line, server_line = warned
        assert "kvpilot is not in #c0ops" in slack_line and "/invite @kvpilot" in slack_line
        assert "server incident: " in server_line and "kvpilot server start" in server_line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        stop(proc)


def test_serve_refuses_to_start_without_a_writable_database(
    tmp_path: Path, slack: FakeSlack
) -> None:
    config = twin_config(tmp_path, free_port(), slack=SLACK)
    (tmp_path / "file").write_text("x")
    config.write_text(config.read_text().replace(
        "[kvpilot]\n", f'[kvpilot]\ndatabase = "{tmp_path}/file/kvpilot.db"\n'
    ))  # fmt: skip
    proc = spawn_serve(config, free_port(), serve_env(slack, socket_mode=False))
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        stop(proc)
    assert proc.returncode == 2, err[-3000:]
    assert f"error: database: {tmp_path}/file/kvpilot.db cannot be created" in err
    assert "Fix: set [kvpilot] database" in err and "Traceback" not in err


@pytest.mark.serial
def test_sigterm_leaves_experiments_recorded_and_the_next_start_resumes_them(
    tmp_path: Path, slack: FakeSlack
) -> None:
    """`systemctl restart kvpilot` during an experiment: the bot stops at once, records where
    the experiment was, and the next start carries it on (here the bot was away longer than the
    gate can bridge, so the interrupted warm-up is reverted)."""

    twin_port = free_port()
    # a long warm-up (30 s of wall time at 200x) keeps the experiment in a measuring state; a
    # gap of 20 simulated seconds (0.1 s of wall time) cuts it, so the bot's restart always
    # interrupts the measurement (`test_crash_twin` resumes untouched measurements instead)
    gate = "scrape_s = 10\nbatch_s = 60\nwarmup_s = 6000\nmax_gap_s = 20\n"
    config = twin_config(tmp_path, twin_port, slack=SLACK, gate=gate)
    env = serve_env(slack, socket_mode=False)
    cli = [sys.executable, "-m", "bot.cli"]
    subprocess.run(
        [*cli, "server", "start", "--server", "incident", "--config", str(config)],
        cwd=REPO, env=env, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    try:
        _sigterm_then_resume(tmp_path, config, env, cli, twin_port)
    finally:  # whatever failed, the twin the test started is stopped
        subprocess.run(
            [*cli, "server", "stop", "--server", "incident", "--config", str(config)],
            cwd=REPO, env=env, capture_output=True, timeout=60,
        )  # fmt: skip


def _sigterm_then_resume(
    tmp_path: Path, config: Path, env: dict[str, str], cli: list[str], twin_port: int
) -> None:
    from storage import audit  # noqa: PLC0415
    from storage import experiments as store  # noqa: PLC0415
    from storage.db import open_db  # noqa: PLC0415

    # An approved experiment that nobody carries (its kvpilot was killed right after approval).
    marker = tmp_path / "paused"
    first = subprocess.Popen(
        [*FAULTY_CLI, "experiment", "--server", "incident", "--set",
         "mem_fraction_static=0.88", "--yes", "--config", str(config)],
        cwd=REPO, env={**env, "KVPILOT_FAULT_PAUSE_BEFORE": "approved",
                       "KVPILOT_FAULT_MARKER": str(marker)},
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert first.poll() is None, "the first kvpilot exited before pausing"
            assert time.monotonic() < deadline, "the first kvpilot never paused"
            time.sleep(0.05)
    finally:
        first.kill()
        first.wait(timeout=10)
    db = open_db(tmp_path / "var" / "kvpilot.db")
    (row,) = store.list_experiments(db)

    log = tmp_path / "serve.log"

    def wait_state(state: str, proc: subprocess.Popen[str]) -> None:
        deadline = time.monotonic() + 90
        while str(store.get_experiment(db, row.id).state) != state:
            assert proc.poll() is None, log.read_text()[-3000:]
            if time.monotonic() > deadline:
                proc.kill()
                moves = [(str(t.to_state), t.reason) for t in store.transitions(db, row.id)]
                progress = store.get_experiment(db, row.id).progress
                raise AssertionError(
                    f"never reached {state}: {moves} {progress} {log.read_text()[-3000:]}"
                )
            time.sleep(0.05)

    serve = spawn_serve(config, free_port(), env, log=log)
    try:
        wait_state("warming_up", serve)  # the bot took it over and restarted with 0.88
        assert (
            httpx.get(f"http://127.0.0.1:{twin_port}/server_info").json()["mem_fraction_static"]
            == 0.88
        )
        began = time.monotonic()
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=30) == 0
        took = time.monotonic() - began
    finally:
        stop(serve)
    err = log.read_text()
    assert took < 20, took  # it stopped at the next scrape, not at the end of the trial
    assert "Traceback" not in err, err[-3000:]
    left = store.get_experiment(db, row.id)
    assert str(left.state) == "warming_up" and left.lease_owner is None
    (stopped,) = audit.events(db, name="bot_stopped")
    assert stopped["properties"]["signal"] == "SIGTERM"
    assert stopped["properties"]["experiments"] == [
        {"id": row.id, "server": "incident", "state": "warming_up", "stopped": True}
    ]
    # the next start resumes it: the measurement was cut by the gap, so it is reverted
    again = spawn_serve(config, free_port(), env, log=log)
    try:
        wait_state("reverted", again)
        info = httpx.get(f"http://127.0.0.1:{twin_port}/server_info", timeout=10).json()
        assert info["mem_fraction_static"] == 0.85
        again.send_signal(signal.SIGTERM)
        assert again.wait(timeout=30) == 0
    finally:
        stop(again)
    moves = [(str(t.from_state), str(t.to_state)) for t in store.transitions(db, row.id)]
    assert ("warming_up", "reverting") in moves and moves[-1] == ("reverting", "reverted")
    (cut,) = [t for t in store.transitions(db, row.id) if str(t.to_state) == "reverting"]
    assert "went unread" in cut.reason and cut.details["cause"] == "interrupted", cut


def test_sigterm_does_not_wait_for_a_diagnosis_still_measuring(
    tmp_path: Path, slack: FakeSlack
) -> None:
    """A diagnosis measures for three minutes or more; `serve` stopped meanwhile must exit
    within its grace, not when the measurement ends (systemd would SIGKILL it first), and say
    what it left."""
    with fake_sglang() as server:
        config = tmp_path / "kvpilot.toml"
        config.write_text(
            f'{SLACK}channels = ["C0OPS"]\n[servers.incident]\nurl = "{server.url}"\n'
        )
        port = free_port()
        proc = spawn_serve(config, port, serve_env(slack, socket_mode=False), log=tmp_path / "log")
        try:
            deadline = time.monotonic() + 60
            while "listening on" not in (tmp_path / "log").read_text():
                assert proc.poll() is None and time.monotonic() < deadline, (
                    tmp_path / "log"
                ).read_text()[-3000:]
                time.sleep(0.1)
            driver = SlackDriver(f"http://127.0.0.1:{port}/slack/events", slack)
            assert driver.slash("diagnose incident", user="U1").status_code == 200
            deadline = time.monotonic() + 30
            while server.requests.count("/metrics") < 3:  # measuring
                assert time.monotonic() < deadline, server.requests
                time.sleep(0.1)
            stopped = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
            took = time.monotonic() - stopped
        finally:
            stop(proc)
    log = (tmp_path / "log").read_text()
    assert took < 30, (took, log[-3000:])
    assert "1 request(s) still at work" in log and "abandoned" in log, log[-3000:]
