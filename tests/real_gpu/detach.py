"""Runs longer than one call: `--detach` and `--attach`.

A call may take ten minutes; an A/B side with a ten-minute window takes about twelve. With
`--detach` the runner starts itself again in a process session of its own, which the machine
keeps running after the call returns (it ends only the call's own processes), follows its
output until the call's budget is spent, and brings back its files (those written so far if
it goes on). The next call,
made while the machine is still warm (30 s), runs with `--attach`: it follows the same run on
and, once it has ended, copies its files into $OUT. Standard library only, like `run.py`
before its checks.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

EXIT_STILL_RUNNING = 10  # the detached run goes on: call again with --attach
LOG, EXIT = "detached.log", "detached.exit"
# options of the calling command that the detached run sets for itself
OWN_OPTIONS = ("--detach", "--attach", "--out", "--budget-s", "--detached-budget-s")


def child_argv(argv: Sequence[str], out: Path, budget_s: float) -> list[str]:
    """The call's own arguments for the detached run: its own results folder and budget."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in OWN_OPTIONS:
            skip = "=" not in arg and name not in ("--detach", "--attach")
            continue
        kept.append(arg)
    return [*kept, "--out", str(out), "--budget-s", f"{budget_s:g}"]


def start(command: Sequence[str], run_dir: Path, cwd: Path) -> subprocess.Popen[bytes]:
    """Start `command` in its own session, its output in the run's log and its exit status in
    a file of its own when it ends."""
    shutil.rmtree(run_dir, ignore_errors=True)  # an earlier run's files are not this one's
    run_dir.mkdir(parents=True)
    (run_dir / LOG).touch()  # followed at once, before the run's shell has opened it
    script = '"$@" >> "$KVPILOT_DETACHED_DIR/{log}" 2>&1; echo $? > "$KVPILOT_DETACHED_DIR/{exit}"'
    return subprocess.Popen(
        ["sh", "-c", script.format(log=LOG, exit=EXIT), "detached", *command],
        cwd=cwd,
        env={**os.environ, "KVPILOT_DETACHED_DIR": str(run_dir), "PYTHONUNBUFFERED": "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def exit_status(run_dir: Path) -> int | None:
    """The detached run's exit status, or None while it runs."""
    try:
        return int((run_dir / EXIT).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def follow(
    run_dir: Path,
    deadline: float,
    echo: Callable[[str], None],
    offset: int = 0,
    poll_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[int | None, int]:
    """Echo the run's log from `offset` until it ends or `deadline`; (its exit status or None,
    the offset reached)."""
    log = run_dir / LOG
    while True:
        status = exit_status(run_dir)  # read before the log: its last lines are then in
        if log.exists():
            with log.open("rb") as f:
                f.seek(offset)
                chunk = f.read()
            offset += len(chunk)
            for line in chunk.decode(errors="replace").splitlines():
                echo(line)
        if status is not None or clock() >= deadline:
            return status, offset
        time.sleep(poll_s)


def collect(run_dir: Path, out: Path, most: int = 8) -> list[str]:
    """The detached run's result files, copied flat into this call's results folder, and its
    whole log where one more file may come back (`most` files in all)."""
    out.mkdir(parents=True, exist_ok=True)
    copied = []
    for path in sorted((run_dir / "out").glob("*")):
        if path.is_file():
            shutil.copy2(path, out / path.name)
            copied.append(path.name)
    if len(copied) < most:
        shutil.copy2(run_dir / LOG, out / LOG)
        copied.append(LOG)
    return copied


def finish(run_dir: Path, status: int | None, out: Path, say: Callable[[str], None]) -> int:
    """This call's exit status: the run's own once it ended (its files copied), else a note."""
    if status is None:
        # what it has written so far comes back too: a side's results outlive a lost machine
        files = collect(run_dir, out)
        say(
            f"the detached run goes on ({run_dir}); call again within 30 s with the same "
            f"command and --attach instead of --detach; its files so far: {', '.join(files)}"
        )
        return EXIT_STILL_RUNNING
    files = collect(run_dir, out)
    say(f"the detached run ended, exit {status}; its files: {', '.join(files) or 'none'}")
    return status
