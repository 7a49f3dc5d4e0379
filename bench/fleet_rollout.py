"""The rollout `bench.fleet_load` runs while commands arrive: a change kept on one server of a
group, rolled out by the bot over the group's other servers through their launchers.

The group's servers are `bench.fleet_server` processes, each behind kvpilot's `process`
launcher (started with `kvpilot server start`, restarted by the rollout's experiments), whose
readings follow their arguments, so a raise of the fraction shows the gate a gain and every step
is kept. Their gate is short (a scrape a second, 2 s batches, a 12 s baseline) so that a wave of
`max_concurrent_restarts` steps takes about half a minute and 99 servers fit in the run; the
fleet's other servers and the twins keep the configuration's gate.

Measured from the bot's database once the run is over (`figures`): the rollout's wall time and
outcome, each step's verdict, how many steps ran at once and how many servers were down for
their restart at once (from `experiment_transitions`), and the acknowledgement latency of the
commands sent while the rollout was open.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
import statistics
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path

from bench.load import (
    CHANNEL,
    INTERVAL_S,
    others,
    percentile,
    pinned,
    propose_and_approve,
    sampler_lag,
)
from storage import experiments as store
from storage.db import open_db
from tests.bot.harness import SlackDriver, buttons, wait_until
from tests.slackfake import FakeSlack

GROUP = "rollout"
MAX_CONCURRENT_RESTARTS = 10
CHANGE = "mem_fraction_static=0.88"
START_FRACTION = "0.80"
GATE = {"scrape_s": 1, "batch_s": 2, "baseline_s": 12, "warmup_floor_s": 4, "max_trial_s": 60}


def member(i: int) -> str:
    return f"roll{i:03d}"


def group_lines() -> list[str]:
    return [f"[groups.{GROUP}]", f"max_concurrent_restarts = {MAX_CONCURRENT_RESTARTS}", ""]


def member_lines(i: int, port: int) -> list[str]:
    """`[servers.rollNNN]`: a `bench.fleet_server` in the group, behind the process launcher,
    away from the bot's CPU."""
    command = pinned(others(), [
        sys.executable, "-m", "bench.fleet_server", "--port", str(port),
        "--mem-fraction-static", START_FRACTION,
    ])  # fmt: skip
    name = member(i)
    return [
        f"[servers.{name}]", f'url = "http://127.0.0.1:{port}"', 'engine = "sglang"',
        f'group = "{GROUP}"', f"[servers.{name}.gate]",
        *(f"{k} = {v}" for k, v in GATE.items()),
        f"[servers.{name}.launcher]", 'kind = "process"', f"command = {json.dumps(command)}", "",
    ]  # fmt: skip


def keep_on_first(driver: SlackDriver, slack: FakeSlack, db_path: Path) -> int:
    """Propose and approve the change on the group's first server, wait for the gate to keep
    it; the experiment's id."""
    propose_and_approve(driver, slack, member(0), CHANGE)
    db = open_db(db_path)
    try:

        def ended() -> store.ExperimentRow | None:
            rows = store.list_experiments(db, member(0), limit=1)
            return rows[0] if rows and rows[0].terminal else None

        row = wait_until(ended, 300, f"the experiment on {member(0)}")
    finally:
        db.close()
    if row.state != "kept":
        raise RuntimeError(f"the change was not kept on {member(0)}: {row.state}")
    return int(row.id)


def start_rollout(driver: SlackDriver, slack: FakeSlack) -> None:
    """Click the verdict's "Roll out" button as the approver."""
    ts, msg = wait_until(
        lambda: next(
            ((t, m) for t, m in slack.messages(CHANNEL).items() if "kvpilot.rollout" in buttons(m)),
            None,
        ),
        120,
        "the verdict's rollout button",
    )
    driver.click("kvpilot.rollout", buttons(msg)["kvpilot.rollout"], user="U2", message_ts=ts)


def _at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The largest number of `spans` (start, end) open at one moment."""
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def in_group(server: str) -> bool:
    return server.startswith("roll")


def outside_group(server: str) -> bool:
    return not in_group(server)


def figures(db_path: Path, sent: list[tuple[float, float]], since: float) -> str:
    """The rollout's figures from the bot's database, the acknowledgement latency of the
    commands sent while it was open, and how late the group's servers were sampled (a server
    restarting answers no scrape, so its next sample comes a round late)."""
    late, _ = sampler_lag(db_path, since, 0, in_group)
    conn = sqlite3.connect(db_path)
    try:
        rollout = conn.execute(
            "SELECT id, created_at, ended_at, outcome, reason FROM rollouts WHERE group_name = ? "
            "ORDER BY id DESC LIMIT 1",
            [GROUP],
        ).fetchone()
        if rollout is None:
            return "rollout: none was started"
        rid, created, ended, outcome, reason = rollout
        steps = conn.execute(
            "SELECT experiment_id, status FROM rollout_steps "
            "WHERE rollout_id = ? AND kind = 'apply'",
            [rid],
        ).fetchall()
        ids = [int(e) for e, _ in steps if e is not None]
        moves = conn.execute(
            f"SELECT experiment_id, to_state, created_at FROM experiment_transitions "
            f"WHERE experiment_id IN ({','.join('?' * len(ids))}) ORDER BY id",
            ids,
        ).fetchall() if ids else []  # fmt: skip
        states = Counter(
            str(s) for (s,) in conn.execute(
                f"SELECT state FROM experiments WHERE id IN ({','.join('?' * len(ids))})", ids
            )
        ) if ids else Counter()  # fmt: skip
    finally:
        conn.close()
    start, end = _at(created), _at(ended) if ended else None
    by_exp: dict[int, list[tuple[str, float]]] = {}
    for exp, state, at in moves:
        by_exp.setdefault(int(exp), []).append((str(state), _at(at)))
    step_spans, down = [], []
    phases: dict[str, list[float]] = {}
    for trail in by_exp.values():
        step_spans.append((trail[0][1], trail[-1][1]))
        for (state, at), (_, after) in itertools.pairwise(trail):
            phases.setdefault(state, []).append(after - at)
            if state in ("restarting", "reverting"):
                down.append((at, after))
    took = sorted(b - a for a, b in step_spans)
    during = sorted(took for at, took in sent if at >= start and (end is None or at <= end))
    lasted = f"{end - start:.0f} s" if end else "still open at the end of the run"
    return "\n".join([
        f"rollout over {len(steps)} servers of group {GROUP} (max_concurrent_restarts = "
        f"{MAX_CONCURRENT_RESTARTS}): {outcome or 'open'} in {lasted}"
        + (f" ({reason})" if reason else ""),
        "  steps by state: " + ", ".join(f"{k} {v}" for k, v in sorted(states.items())),
        f"  a step took median {percentile(took, 50):.0f} s, max {max(took, default=0):.0f} s; "
        "median seconds in each state: "
        + ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in phases.items() if v),
        f"  steps running at once at most: {most_at_once(step_spans)}; servers restarting at "
        f"once at most: {most_at_once(down)} ({len(down)} restarts)",
        f"  acknowledgements while it ran: {len(during)} commands, p50 "
        f"{percentile(during, 50) * 1000:.0f} ms, p99 {percentile(during, 99) * 1000:.0f} ms, "
        f"max {max(during, default=0) * 1000:.0f} ms",
        f"  the group's servers' samples: {len(late)}, late past the interval p99 "
        f"{percentile(late, 99):.2f} s, max {max(late, default=0):.2f} s, "
        f"{sum(x > INTERVAL_S / 2 for x in late)} a round or more late",
    ])  # fmt: skip
