"""The sampler in a process of its own: real child processes, a real database file, real HTTP.

It samples into the bot's database, the bot sees its rounds as it sees a sampler thread's, it is
started again when it dies, it never outlives the bot, and `[sampler] process` decides where it
runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bot.app import logs
from bot.app.config import Config, ConfigError, load, parse
from bot.app.config.schedule import PROCESS_FROM_SERVERS
from bot.reports.sampler_process import SamplerProcess, child_command, samples_in_a_process
from playbooks.clock import WallClock
from storage.db import open_db
from storage.metric_samples import samples_between
from tests.bot.harness import wait_until
from tests.bot.reports.fake_sglang import FakeSGLang


def config_file(tmp_path: Path, url: str, count: int = 3, **kvpilot: Any) -> Config:
    lines = [f'database = "{tmp_path / "kvpilot.db"}"']
    lines += [f"{key} = {value}" for key, value in kvpilot.items()]
    lines += ["", "[sampler]", "interval_s = 1", "process = true", ""]
    for i in range(count):
        lines += [f"[servers.s{i}]", f'url = "{url}"', ""]
    path = tmp_path / "kvpilot.toml"
    path.write_text("[kvpilot]\n" + "\n".join(lines))
    return load(str(path))


def sampled(proc: SamplerProcess) -> bool:
    return all(s.last is not None for s in proc.states.values())


def test_the_process_samples_into_the_bots_database_and_stops_with_it(
    tmp_path: Path, fake: FakeSGLang
) -> None:
    config = config_file(tmp_path, fake.url)
    proc = SamplerProcess(config, WallClock())
    proc.start()
    try:
        wait_until(lambda: sampled(proc), 60, "every server sampled by the process")
        assert proc.running and proc.pid not in (None, os.getpid())
        assert (
            f"sampler running in process {proc.pid}: every 1 s, 3 server(s)" in (proc.describe()[0])
        )
        assert proc.health_view().running and proc.health_view().last_round_mono is not None
        assert set(proc.lag_s()) == {"s0", "s1", "s2"}
        db = open_db(config.database)
        assert samples_between(db, "s0", 0, 1e12), "the rows are in the bot's database"
        db.close()
        child = proc._proc
    finally:
        proc.stop()
    assert child is not None and child.poll() == 0, "it finished its round and exited"
    assert not proc.running and proc.exits == 0


def test_a_process_that_dies_is_started_again(tmp_path: Path, fake: FakeSGLang) -> None:
    proc = SamplerProcess(config_file(tmp_path, fake.url), WallClock(), restart_s=0.1)
    proc.start()
    try:
        wait_until(lambda: sampled(proc), 60, "first rounds")
        first = proc.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: proc.exits == 1 and proc.running and proc.pid != first, 60, "restart")
        rounds = proc.last_round_mono
        wait_until(lambda: proc.last_round_mono != rounds, 60, "a round of the new process")
    finally:
        proc.stop()


def test_the_process_never_outlives_the_bot(tmp_path: Path, fake: FakeSGLang) -> None:
    """Its input closes when the bot dies, however it dies; then it exits."""
    config = config_file(tmp_path, fake.url)
    child = subprocess.Popen(
        child_command(config), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdin is not None
    with child:
        assert '"servers"' in child.stdout.readline()  # a round
        child.stdin.close()
        assert child.wait(30) == 0


def test_a_line_that_is_not_a_round_changes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proc = SamplerProcess(config_file(tmp_path, "http://127.0.0.1:9"), WallClock())
    before = dict(proc.states)
    for line in ("", "not json", '{"servers": 3}', "[1]", '{"servers": {"s0": "up"}}'):
        proc._round(line)
    assert proc.states == before and proc.last_round_mono is None
    assert "not a round" in caplog.text


@pytest.mark.parametrize(
    ("process", "servers", "scale", "expected"),
    [
        (None, PROCESS_FROM_SERVERS - 1, 1.0, False),
        (None, PROCESS_FROM_SERVERS, 1.0, True),
        (True, 1, 1.0, True),
        (False, 500, 1.0, False),
        (True, 500, 60.0, False),  # an accelerated twin keeps one clock: a thread
        (None, 500, 60.0, False),
    ],
)
def test_where_the_sampler_runs(
    tmp_path: Path, process: bool | None, servers: int, scale: float, expected: bool
) -> None:
    table: dict[str, Any] = {
        "kvpilot": {"time_scale": scale},
        "servers": {f"s{i}": {"url": "http://127.0.0.1:9"} for i in range(servers)},
    }
    if process is not None:
        table["sampler"] = {"process": process}
    assert samples_in_a_process(parse(table, tmp_path / "kvpilot.toml")) is expected


@pytest.mark.parametrize("value", ["yes", 1, "on", ["auto"]])
def test_a_process_setting_that_is_not_one_names_the_three(tmp_path: Path, value: Any) -> None:
    with pytest.raises(ConfigError, match=r'sampler.process: true .* false .* or "auto"'):
        parse({"sampler": {"process": value}}, tmp_path / "kvpilot.toml")


def test_the_child_is_run_by_this_interpreter(tmp_path: Path) -> None:
    config = config_file(tmp_path, "http://127.0.0.1:9")
    assert child_command(config)[:3] == [sys.executable, "-m", "bot.reports.sampler_process"]


def test_the_child_logs_as_the_bot_logs(tmp_path: Path) -> None:
    config = config_file(tmp_path, "http://127.0.0.1:9")
    assert child_command(config)[-2:] == ["--config", str(config.path)]  # nothing configured
    logs.configure("INFO", json=True)
    try:
        assert child_command(config)[-3:] == ["--log-level", "INFO", "--log-json"]
        logs.configure("DEBUG", json=False)
        assert child_command(config)[-2:] == ["--log-level", "DEBUG"]
    finally:
        logs.reset()
