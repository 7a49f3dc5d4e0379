"""Run a command as a supervised process tree that is always torn down completely.

Usage: ``python reaper.py COMMAND [ARGS...]`` (standard library only, Linux).

The harness starts the SGLang server through this wrapper so that stopping it is quick and leaves
nothing behind, not even zombies (the init process of some sandboxes never reaps orphans):

* the wrapper is a *child subreaper*, so when the server dies its orphaned children (scheduler,
  detokenizer, multiprocessing's resource tracker) are re-parented to the wrapper, which reaps
  them;
* the command runs in its own process group; on exit the wrapper SIGKILLs that group and reaps
  every child until none is left;
* SIGINT: kill the group at once. SIGTERM: forward SIGTERM to the command (SGLang drains and shuts
  down), wait up to ``KVPILOT_REAPER_GRACE_S`` seconds (default 10), then kill the group;
* the wrapper gets SIGTERM when its own parent dies, so a crashed test run cleans up too;
* after the tree is gone it unlinks the ``/dev/shm`` files the tree had open (SGLang leaves its
  load-snapshot segment behind), and if its parent died it also removes the directory named by
  ``KVPILOT_REAPER_CLEANUP_DIR`` (the harness's work directory).

Exit status: the command's (``128 + signal`` if a signal ended it).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
SHM_SCAN_INTERVAL_S = 5.0


class _Stop(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop(signum)


def _ignore_stop_signals() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)


def _status_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _wait_for(pid: int, timeout: float) -> int | None:
    """Reap children until ``pid`` exits (its status code) or ``timeout`` passes (None)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return None
        if got == pid:
            return _status_code(status)
        if got == 0:
            time.sleep(0.05)
    return None


def _children() -> list[int]:
    """PIDs whose parent is this process (orphans re-parented to us included)."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # Fields after the parenthesised command name: state, ppid, ...
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == me:
            found.append(int(entry))
    return found


def _session_shm_files() -> set[str]:
    """``/dev/shm`` paths open or mapped by any process of this session."""
    sid, found = os.getsid(0), set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if os.getsid(int(entry)) != sid:
                continue
            for fd in os.listdir(f"/proc/{entry}/fd"):
                with contextlib.suppress(OSError):
                    found.add(os.readlink(f"/proc/{entry}/fd/{fd}"))
            with open(f"/proc/{entry}/maps") as maps:
                for line in maps:
                    fields = line.split(None, 5)
                    if len(fields) == 6:
                        found.add(fields[5].strip())
        except OSError:
            continue
    return {path for path in found if path.startswith("/dev/shm/")}


def _kill_group_and_reap(pgid: int) -> None:
    """SIGKILL the command's process group and every child of ours; reap until none is left."""
    while True:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        for pid in _children():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        try:
            got, _ = os.waitpid(-1, 0)
        except ChildProcessError:
            return
        while got:  # reap whatever else is already done
            try:
                got, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_stop)
    parent = os.getppid()
    if parent == 1:  # the parent died before PDEATHSIG was armed
        return 1
    grace = float(os.environ.get("KVPILOT_REAPER_GRACE_S", "10"))
    child = subprocess.Popen(argv, process_group=0)
    code: int | None = None
    shm_files: set[str] = set()
    next_scan = time.monotonic() + 1.0
    try:
        while code is None:
            got, status = os.waitpid(-1, os.WNOHANG)
            if got == child.pid:
                code = _status_code(status)
            elif got == 0:
                if time.monotonic() >= next_scan:  # segments appear during start-up
                    shm_files |= _session_shm_files()
                    next_scan = time.monotonic() + SHM_SCAN_INTERVAL_S
                time.sleep(0.2)
    except _Stop as stop:
        _ignore_stop_signals()
        shm_files |= _session_shm_files()
        if stop.signum == signal.SIGTERM and grace > 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGTERM)
            code = _wait_for(child.pid, grace)
        if code is None:
            code = 128 + stop.signum
    except ChildProcessError:
        code = 1
    _ignore_stop_signals()
    shm_files |= _session_shm_files()
    _kill_group_and_reap(child.pid)
    child.returncode = code  # already reaped above; keep Popen from waiting again
    for path in shm_files:
        with contextlib.suppress(OSError):
            os.unlink(path)
    cleanup_dir = os.environ.get("KVPILOT_REAPER_CLEANUP_DIR")
    if cleanup_dir and os.getppid() != parent:
        shutil.rmtree(cleanup_dir, ignore_errors=True)
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
