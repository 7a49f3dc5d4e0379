"""The eval command's runner: started detached, looked at once per step, its end read back."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest

from playbooks.quality.check import EvalCommand
from playbooks.quality.compare import EvalOutcome
from playbooks.quality.eval_process import EvalRun, poll_eval, start_eval

URL = "http://127.0.0.1:30000"


def finished(run: EvalRun, within_s: float = 30.0) -> EvalOutcome:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        got = poll_eval(run)
        if isinstance(got, EvalOutcome):
            return got
        assert got == "running"
        time.sleep(0.05)
    raise AssertionError("the eval command never finished")


def python(code: str, tmp_path: Path, timeout_s: float = 30.0) -> EvalCommand:
    return EvalCommand((sys.executable, "-c", code), str(tmp_path), timeout_s)


def test_it_sees_the_server_url_and_its_exit_status_is_read_back(tmp_path: Path) -> None:
    code = (
        "import os, pathlib, sys; print('scored 0.7'); "
        "pathlib.Path('seen').write_text(os.environ['KVPILOT_SERVER_URL']); sys.exit(1)"
    )
    run = start_eval(python(code, tmp_path), URL, 7)
    assert "kvpilot-eval-7-" in run.status
    outcome = finished(run)
    assert (outcome.exit_code, outcome.timed_out, outcome.error) == (1, False, "")
    assert outcome.tail.strip() == "scored 0.7"
    assert (tmp_path / "seen").read_text() == URL  # the URL, and the configuration's directory
    assert not Path(run.status).exists()  # read once, then removed


def test_a_command_past_its_timeout_is_killed(tmp_path: Path) -> None:
    run = start_eval(python("import time; time.sleep(60)", tmp_path, 0.5), URL, 8)
    outcome = finished(run)
    assert outcome.timed_out and outcome.exit_code is None and outcome.seconds < 30


def test_a_command_that_cannot_start_says_why(tmp_path: Path) -> None:
    command = EvalCommand(("./no-such-eval",), str(tmp_path), 30.0)
    outcome = finished(start_eval(command, URL, 9))
    assert outcome.exit_code is None and "No such file or directory" in outcome.error


@pytest.mark.parametrize(
    "run",
    [
        EvalRun("/tmp/kvpilot-eval-missing.json", 2**22 + 12345, "this-host"),  # another host
        EvalRun("/tmp/kvpilot-eval-missing.json", 1, ""),  # a pid that is not its runner
    ],
)
def test_a_runner_gone_without_a_status_has_vanished(run: EvalRun) -> None:
    here = EvalRun(run.status, run.pid, run.host or socket.gethostname())
    assert poll_eval(here) == "vanished"
    assert EvalRun.from_json(here.to_json()) == here
