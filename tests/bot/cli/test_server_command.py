"""`kvpilot server start|status` through the process launcher with commands that are not an
engine: each failure is said at once, with the log's last lines and its path, and `status`
reads as text with an exit code scripts can wait on."""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path

import httpx
import pytest

from bot.app.config import load
from bot.app.wiring import launcher
from bot.cli import main
from playbooks.clock import WallClock
from playbooks.launchers.base import LaunchError
from tests.ports import free_port
from tests.twin_process import running_twin


def write_config(tmp_path: Path, command: list[str], port: int) -> Path:
    config = tmp_path / "kvpilot.toml"
    config.write_text(
        f'[servers.s]\nurl = "http://127.0.0.1:{port}"\n'
        '[servers.s.launcher]\nkind = "process"\nready_timeout_s = 600\nstop_timeout_s = 2\n'
        f"command = {json.dumps(command)}\n"
    )
    return config


def cli(config: Path, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main([*args, "--server", "s", "--config", str(config)], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_a_command_that_serves_something_else_fails_at_once_and_is_stopped(
    tmp_path: Path,
) -> None:
    """`python -m http.server` answers 404 on /health: not SGLang, whatever the wait."""
    port = free_port()
    config = write_config(
        tmp_path, [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], port
    )
    started = time.monotonic()
    code, _, err = cli(config, "server", "start")
    took = time.monotonic() - started
    assert code == 1, err
    assert took < 60, took  # not the 600 s of ready_timeout_s
    assert "answers HTTP 404 on /ready and /health" in err and "it is not SGLang" in err, err
    assert "Traceback" not in err
    code, out, _ = cli(config, "server", "status")
    assert code == 1 and "s: down" in out, out  # stopped, not left holding the port


def test_a_start_that_exits_shows_the_logs_last_lines_and_its_path(tmp_path: Path) -> None:
    port = free_port()
    script = "import sys; print('loading weights'); print('ValueError: no such model'); sys.exit(3)"
    config = write_config(tmp_path, [sys.executable, "-c", script], port)
    code, _, err = cli(config, "server", "start")
    assert code == 1, err
    assert "exited before it was ready" in err, err
    assert "ValueError: no such model" in err and "loading weights" in err, err
    logs = sorted((tmp_path / "var" / "state").glob("s-*.log"))
    assert logs and f"of {logs[-1]}:" in err, err


def test_status_reads_as_text_and_its_exit_code_says_whether_it_serves(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, [sys.executable, "-c", "pass"], port)
    code, out, err = cli(config, "server", "status")
    assert code == 1, err
    assert out.startswith("s: down (") and "arguments:" in out, out
    code, out, _ = cli(config, "server", "status", "--json")
    assert code == 1 and json.loads(out)["running"] is False


def test_a_server_the_launcher_did_not_start_is_not_called_down(tmp_path: Path) -> None:
    """Someone started the server by hand: it answers, and kvpilot says whose it is and what
    to do, instead of "down"; a start refuses rather than die on the busy port."""
    with running_twin(["--time-scale", "100"]) as twin:
        config = write_config(tmp_path, [sys.executable, "-m", "sim.launch_server"], twin.port)
        code, out, _ = cli(config, "server", "status")
        assert "down" not in out, out
        assert "did not start it" in out and "kvpilot server start --server s" in out, out
        code, out, err = cli(config, "server", "start")
        assert code == 0 and "already running" in out and "did not start it" in out, (out, err)
        # a restart of an experiment would start a second one: refused, the first left alone
        loaded = load(str(config))
        found = launcher(loaded, loaded.server("s"), WallClock())
        with pytest.raises(LaunchError, match="did not start it"):
            found.start(found.current_args())
        assert httpx.get(twin.url + "/health", timeout=5).status_code == 200  # left alone
