"""Runs longer than a call: the detached run outlives its caller, and the next call follows
it on and brings its files back."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.real_gpu import detach, run

# writes a result file into the detached run's `out`, slowly, then ends with status 3
FAKE_RUN = (
    "import pathlib, sys, time\n"
    "out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)\n"
    "print('side a: starting', flush=True); time.sleep(1.0)\n"
    "(out / 'ab-a.json').write_text('{}'); print('side a: done', flush=True)\n"
    "sys.exit(3)\n"
)


def test_the_detached_runs_arguments_are_the_calls_own_less_what_it_sets_itself() -> None:
    argv = [
        "--phases",
        "ab",
        "--detach",
        "--out",
        "/o",
        "--budget-s=570",
        "--detached-budget-s",
        "1300",
        "--ab-extra-b=--max-running-requests 40",
        "--ab-steady-s",
        "600",
    ]
    assert detach.child_argv(argv, Path("/w/detached/out"), 1300) == [
        "--phases",
        "ab",
        "--ab-extra-b=--max-running-requests 40",
        "--ab-steady-s",
        "600",
        "--out",
        "/w/detached/out",
        "--budget-s",
        "1300",
    ]


def test_a_detached_run_outlives_the_call_and_the_next_call_collects_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "detached"
    command = [sys.executable, "-c", FAKE_RUN, str(run_dir / "out")]
    proc = detach.start(command, run_dir, tmp_path)
    assert os.getsid(proc.pid) != os.getsid(0)  # its own session: the call's end does not stop it
    lines: list[str] = []
    # the first call's budget ends before the run does
    status, offset = detach.follow(run_dir, time.monotonic() + 0.3, lines.append, poll_s=0.05)
    assert status is None and lines == ["side a: starting"]
    said: list[str] = []
    assert (
        detach.finish(run_dir, status, tmp_path / "call-1", said.append)
        == detach.EXIT_STILL_RUNNING
    )
    assert "--attach" in said[0]
    # what it wrote so far comes back with the call that leaves it running: its log
    assert sorted(p.name for p in (tmp_path / "call-1").iterdir()) == [detach.LOG]
    # the next call follows on from where the first stopped, to the end
    status, _ = detach.follow(run_dir, time.monotonic() + 20, lines.append, offset, 0.05)
    assert status == 3 and lines == ["side a: starting", "side a: done"]
    assert proc.wait(5) == 0  # the shell that wrote the status
    out = tmp_path / "call-2"
    assert detach.finish(run_dir, status, out, said.append) == 3
    assert sorted(p.name for p in out.iterdir()) == ["ab-a.json", detach.LOG]


def test_the_run_can_be_followed_as_soon_as_it_is_started(tmp_path: Path) -> None:
    """The call that detaches follows the run at once: its log must already be there, not
    only once the run's shell has opened it (an H100 call said "no detached run" of the run it
    had just started)."""
    run_dir = tmp_path / "detached"
    proc = detach.start([sys.executable, "-c", "import time; time.sleep(2)"], run_dir, tmp_path)
    try:
        assert (run_dir / detach.LOG).exists()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the shell and the run with it
        proc.wait(5)


def test_attaching_where_nothing_was_detached_says_how_to_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run.main(["--phases", "ab", "--attach", "--work", str(tmp_path), "--out", str(tmp_path)])
    assert code == run.EXIT_USAGE
    assert "no detached run" in capsys.readouterr().out


def test_detach_and_attach_are_one_or_the_other() -> None:
    with pytest.raises(SystemExit):
        run.build_parser().parse_args(["--phases", "ab", "--detach", "--attach"])
