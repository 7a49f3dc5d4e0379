"""The launcher contract: what the experiment engine relies on, whatever runs the server.

1. `apply(args)` restarts the server with `args` and returns once it is ready; a new launcher
   (a restarted bot) reads the same arguments back from the system; `stop` and `start` work.
2. Arguments the server cannot start with raise LaunchError with SGLang's reason and log; the
   system still shows them (nothing is hidden), and applying the previous arguments rolls back.
3. A server that dies later is seen by `state()`, with a reason.
4. If the bot is killed in the middle of `apply`, a new launcher sees the truth (the new
   arguments, not ready) and rolling back works, leaving nothing behind.
5. (below) However many kvpilot processes resume an experiment, the server restarts once.
6. A restart in bounded steps: `issue` returns at once, `poll_ready` looks once (on a fresh
   launcher too) and raises what `apply` raises; `identity` stays while the same server runs and
   changes (or clears) whenever it is replaced, by kvpilot or by its death.
7. A start still loading at `ready_timeout_s` is a timeout, never a failure of the arguments:
   `apply` raises it as such, and `give_up` stops the server (a Kubernetes workload's pods stay
   as the controller has them) and returns the log it read, whose last line says what the
   server was doing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

from playbooks.engines.exits import Failure, last_log_line
from playbooks.engines.sglang.allow_list import with_change
from playbooks.launchers.base import LaunchError, ServerIdentity
from tests.faults.entry import FAULTY_CLI
from tests.playbooks.launchers.harness import Harness
from tests.twin_process import REPO

T = TypeVar("T")


def set_flag(args: list[str], flag: str, value: str) -> list[str]:
    out = list(args)
    out[out.index(flag) + 1] = value
    return out


def wait_for(what: str, check: object, timeout: float = 30.0) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def apply_death_stop_and_start(h: Harness) -> None:
    """Clauses 1 and 3."""
    launcher = h.launcher()
    assert launcher.current_args() == h.baseline
    state = launcher.state()
    assert state.running and state.ready, state
    trial = with_change(h.baseline, {"mem_fraction_static": 0.88})
    launcher.apply(trial)
    fresh = h.launcher()
    assert fresh.current_args() == trial
    assert fresh.state().ready
    assert h.info()["mem_fraction_static"] == 0.88
    assert h.leftovers() == []

    pid = h.server_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for("the launcher to see the server down", lambda: not fresh.state().running)
    state = fresh.state()
    assert not state.ready and state.reason
    if h.exit_status_seen:
        assert "SIGKILL" in state.reason, state.reason

    fresh.stop()
    state = fresh.state()
    assert not state.running and not state.ready, state
    again = h.launcher()  # `kvpilot server start`
    again.start(again.current_args())
    again.wait_ready()
    assert again.state().ready and h.info()["mem_fraction_static"] == 0.88
    assert h.leftovers() == []


def failure_rollback_and_bot_crash(h: Harness) -> None:
    """Clauses 2 and 4."""
    launcher = h.launcher()
    bad = with_change(h.baseline, {"mem_fraction_static": 0.99})
    with pytest.raises(LaunchError) as failure:
        launcher.apply(bad)
    assert "GPU out of memory" in failure.value.reason, failure.value.reason
    assert "CUDA out of memory" in failure.value.log_tail
    assert failure.value.cause is not None and failure.value.cause.memory, failure.value.cause
    fresh = h.launcher()
    assert fresh.current_args() == bad  # the system says what it was told to run
    assert not fresh.state().ready
    fresh.apply(h.baseline)
    after = h.launcher()
    assert after.current_args() == h.baseline
    assert after.state().ready
    assert h.info()["mem_fraction_static"] == 0.85
    assert h.leftovers() == []

    # A slow start (the twin at 1/100 of its usual speed takes ~20 s to load) leaves time to
    # kill the bot while it waits for readiness.
    slow = set_flag(
        with_change(h.baseline, {"mem_fraction_static": 0.88}), "--time-scale", SLOW_SCALE
    )
    bot = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.playbooks.launchers.apply_child",
            str(h.config),
            "twin",
            json.dumps(slow),
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    watcher = h.launcher()

    def mid_apply() -> bool:
        assert bot.poll() is None, bot.stderr.read().decode() if bot.stderr else ""
        return watcher.current_args() == slow and not watcher.state().ready

    try:
        wait_for("the change to reach the system", mid_apply)
    finally:
        bot.kill()
        bot.communicate(timeout=10)  # reaps it and closes its pipe
    fresh = h.launcher()
    assert fresh.current_args() == slow
    assert not fresh.state().ready
    fresh.apply(h.baseline)
    after = h.launcher()
    assert after.current_args() == h.baseline and after.state().ready
    assert h.info()["mem_fraction_static"] == 0.85
    assert h.leftovers() == []


# The twin at 1/100 of its usual speed: its 45 s load takes about 20 wall seconds.
SLOW_SCALE = "2"
LOADING = "Load weight begin"  # the twin's line (SGLang's) while the weights load


def a_slow_start_is_a_timeout(h: Harness) -> None:
    """Clause 7."""
    slow = set_flag(
        with_change(h.baseline, {"mem_fraction_static": 0.88}), "--time-scale", SLOW_SCALE
    )
    # an experiment gives up at its own deadline, with a fresh launcher: what was it doing?
    h.launcher().issue(slow)
    wait_for(
        "the server to load its weights", lambda: LOADING in (last_log_line(h.server_log()) or "")
    )
    fresh = h.launcher()
    assert not fresh.poll_ready()
    log = fresh.give_up()
    assert LOADING in (last_log_line(log) or ""), log[-2000:]
    if h.kind != "deployment":  # the others are stopped, so the slow start frees its GPUs
        wait_for("the slow start to stop", lambda: not h.launcher().state().running)
    # `kvpilot server start` and `apply` wait out the deadline (80 s on this clock: 2 s)
    with pytest.raises(LaunchError) as late:
        h.launcher(ready_timeout_s=80).apply(slow)
    cause = late.value.cause
    assert cause is not None and cause.failure == Failure.timed_out and not cause.memory, cause
    assert "was still starting after 80 s (ready_timeout_s)" in late.value.reason, late.value
    assert "raise ready_timeout_s" in late.value.reason, late.value.reason
    h.launcher().apply(h.baseline)
    after = h.launcher()
    assert after.current_args() == h.baseline and after.state().ready
    assert h.info()["mem_fraction_static"] == 0.85
    assert h.leftovers() == []


GATE = "\n[gate]\nbaseline_s = 60\nscrape_s = 2\nbatch_s = 10\n"


def _kvpilot(h: Harness, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*FAULTY_CLI, *args, "--config", str(h.config)],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def one_process_carries_an_experiment(h: Harness) -> None:
    """Clause 5: however many kvpilot processes resume an interrupted experiment, the server
    restarts once; one next to the living process that carries it touches nothing."""
    from storage import experiments as store  # noqa: PLC0415
    from storage.db import open_db  # noqa: PLC0415

    h.config.write_text(h.config.read_text().replace("[servers.twin]", GATE + "\n[servers.twin]"))
    marker = h.config.parent / "paused"
    owner = _kvpilot(
        h,
        "experiment",
        "--server",
        "twin",
        "--set",
        "mem_fraction_static=0.88",
        "--yes",
        env={"KVPILOT_FAULT_PAUSE_BEFORE": "trial", "KVPILOT_FAULT_MARKER": str(marker)},
    )
    try:

        def paused() -> bool:
            if owner.poll() is not None:
                raise AssertionError(f"the experiment ended early: {owner.communicate()[1]}")
            return marker.exists()

        wait_for("the experiment to reach its trial", paused, 60)
        db = open_db(h.config.parent / "var" / "kvpilot.db")
        (row,) = store.list_experiments(db)
        assert row.state == "trial" and h.info()["mem_fraction_static"] == 0.88
        before = h.starts()
        # a resume next to the living owner leaves the experiment to it
        beside = _kvpilot(h, "resume")
        _, err = beside.communicate(timeout=60)
        assert beside.returncode == 0, err
        assert "carried by another kvpilot process" in err, err
        assert h.starts() == before and store.get_experiment(db, row.id).state == "trial"
    finally:
        owner.kill()
        owner.communicate(timeout=10)  # reaps it and closes its pipes
    # the owner is gone: two resumes at once, and the server restarts exactly once
    racers = [_kvpilot(h, "resume") for _ in range(2)]
    results = [(r.wait(timeout=120), r.communicate()[1]) for r in racers]
    final = store.get_experiment(db, row.id)
    assert final.state == "reverted", results
    assert h.starts() - before == 1, (h.starts() - before, results)
    assert h.info()["mem_fraction_static"] == 0.85
    assert h.launcher().current_args() == h.baseline
    # one did nothing; one continued the trial, which the gate cannot judge on an idle server
    assert sorted(code for code, _ in results) == [0, 5], results
    assert h.leftovers() == []


class Longest:
    """The longest single call of each launcher method, in wall seconds, printed (with `-s`)
    for BENCHMARKS.md: speed is benchmarked (bench/experiment.py), never asserted in a test."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def call(self, what: str, fn: Callable[[], T]) -> T:
        start = time.monotonic()
        try:
            return fn()
        finally:
            took = time.monotonic() - start
            self.seconds[what] = max(self.seconds.get(what, 0.0), took)


def poll_fresh(h: Harness, longest: Longest, timeout: float = 30.0) -> None:
    """Poll until ready, every look by a new launcher (a bot restarted between steps)."""
    deadline = time.monotonic() + timeout
    while not longest.call("poll_ready", h.launcher().poll_ready):
        assert time.monotonic() < deadline, "timed out polling for readiness"
        time.sleep(0.1)


def identity(h: Harness, longest: Longest) -> ServerIdentity | None:
    return longest.call("identity", h.launcher().identity)


def without_pod_names(reason: str) -> str:
    return re.sub(r"pod \S+ of", "pod of", reason)


def issue_poll_and_identity(h: Harness) -> None:
    """Clause 6."""
    longest = Longest()
    before = identity(h, longest)
    assert before is not None and identity(h, longest) == before
    trial = with_change(h.baseline, {"mem_fraction_static": 0.88})
    longest.call("issue", lambda: h.launcher().issue(trial))
    poll_fresh(h, longest)
    assert h.info()["mem_fraction_static"] == 0.88
    after = identity(h, longest)
    assert after is not None and after != before, (before, after)
    assert identity(h, longest) == after
    assert after.started_at is not None and abs(after.started_at - time.time()) < 60, after

    pid = h.server_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for("the identity to change", lambda: identity(h, longest) != after)

    bad = with_change(h.baseline, {"mem_fraction_static": 0.99})
    with pytest.raises(LaunchError) as applied:
        h.launcher().apply(bad)
    longest.call("issue", lambda: h.launcher().issue(bad))
    with pytest.raises(LaunchError) as polled:
        poll_fresh(h, longest)
    assert without_pod_names(polled.value.reason) == without_pod_names(applied.value.reason)
    assert "GPU out of memory" in polled.value.reason, polled.value.reason
    assert "CUDA out of memory" in polled.value.log_tail
    assert polled.value.cause == applied.value.cause, (polled.value.cause, applied.value.cause)
    assert polled.value.cause is not None and polled.value.cause.failure == Failure.out_of_memory
    h.launcher().apply(h.baseline)
    assert h.launcher().state().ready and h.leftovers() == []
    figures = ", ".join(f"{k} {v:.3f} s" for k, v in sorted(longest.seconds.items()))
    print(f"\n{h.kind}: longest single call: {figures}")


# Where the chain below kills the bot: after the step named, in the state named, with what the
# step learnt persisted: one point in every state an idle server's experiment passes through
# (`deciding` needs a verdict of the gate: tests/playbooks/experiments/test_crash_twin.py).
# Each is a separate bot process (`kvpilot experiment`, then `kvpilot
# resume`s), killed by itself with SIGKILL; the next one resumes where it died.
KILL_POINTS = (
    "approved:move",
    "baseline:scrape",  # the baseline starts afresh in this process, so a scrape follows
    "restarting:issue",
    "warming_up:move",
    "trial:scrape",
    "reverting:issue",
)
# The twin of these harnesses has no load, so the gate cannot judge the change and reverts it:
# the verdict an uninterrupted run gives. The bot's restarts take seconds of wall time (minutes
# on this clock), and on a loaded machine a Kubernetes client's start alone can pass the default
# gap limit: every point is one a resumed process reaches whatever the delay, and the gap limit
# is lifted so that every resume continues the measurement (a measurement cut by a gap or a
# restart is tested in tests/playbooks/experiments/: test_steps.py, test_crash_twin.py). The
# gaps also leave batches of the baseline empty; a short baseline measures on for twice
# `baseline_s`, which at 120 s (3 wall seconds on this clock) outlasts a slow resume or two.
CRASH_GATE = "\n[gate]\nbaseline_s = 120\nscrape_s = 2\nbatch_s = 10\nmax_gap_s = 86400\n"


def killed_in_every_state(h: Harness) -> None:
    """Clause 6: SIGKILL of the bot after every kind of step of every non-terminal state, each
    followed by `kvpilot resume`: the experiment ends as an uninterrupted one would (reverted:
    the gate cannot judge an idle server), the server on the baseline, restarted exactly twice
    (the change and its revert), every state entered once."""
    from storage import experiments as store  # noqa: PLC0415
    from storage.db import open_db  # noqa: PLC0415

    h.config.write_text(
        h.config.read_text().replace("[servers.twin]", CRASH_GATE + "\n[servers.twin]")
    )
    before = h.starts()
    first = ("experiment", "--server", "twin", "--set", "mem_fraction_static=0.88", "--yes")
    for i, point in enumerate(KILL_POINTS):
        bot = _kvpilot(
            h, *(first if i == 0 else ("resume",)), env={"KVPILOT_FAULT_KILL_AFTER": point}
        )
        out, err = bot.communicate(timeout=120)
        if bot.returncode != -signal.SIGKILL:
            db = open_db(h.config.parent / "var" / "kvpilot.db")
            moves = [
                (str(t.to_state), t.reason) for r in store.list_experiments(db)
                for t in store.transitions(db, r.id)
            ]  # fmt: skip
            raise AssertionError((point, bot.returncode, out[-1000:], err[-3000:], moves))
    last = _kvpilot(h, "resume")
    _, err = last.communicate(timeout=120)
    db = open_db(h.config.parent / "var" / "kvpilot.db")
    (row,) = store.list_experiments(db)
    assert row.state == "reverted", err
    moves = [(str(t.from_state), str(t.to_state)) for t in store.transitions(db, row.id)]
    assert [to for _, to in moves] == [
        "proposed", "approved", "baseline", "restarting", "warming_up", "trial", "reverting",
        "reverted",
    ], moves  # fmt: skip
    assert h.starts() - before == 2, (h.starts() - before, moves)
    assert h.info()["mem_fraction_static"] == 0.85
    assert h.launcher().current_args() == h.baseline
    assert h.leftovers() == []


# The whole contract, for a system that runs it all (the real daemons' tier).
EVERY_CLAUSE = (
    apply_death_stop_and_start,
    failure_rollback_and_bot_crash,
    issue_poll_and_identity,
    killed_in_every_state,
    one_process_carries_an_experiment,
)
