"""One bot serving a fleet: `bench.load` at fleet size, half SGLang- and half vLLM-shaped.

    python -m bench.fleet_load [--servers 500] [--experiments 5] [--group 100] [--rate 50]
                               [--seconds 600]

What runs, as in `bench.load` (real time, loopback, the bot pinned to CPU 0 and the rest to the
other cores with `taskset`): `--servers` servers from one `bench.fleet` process, the first half
answering with the real SGLang 0.5.23's recorded bodies and the second half with the real vLLM
0.32.0's, all sampled every 15 s; `--experiments` incident twins, each with an approved
experiment measuring its baseline; `--group` of the `--servers` as separate processes in one
`[groups.rollout]` (`max_concurrent_restarts = 10`) behind the process launcher, over which the
bot rolls out a change kept on the first of them (`bench.fleet_rollout`) while `--rate` signed
slash commands a second arrive for `--seconds`, open-loop.

Printed, beside `bench.load`'s figures (acknowledgement latency p50/p99, the sampler's lateness
and a round's duration, the bot's CPU and resident memory): the database's size after the run
and at steady state (each table's growth rate times how long the sampler keeps its rows, see
`steady_state`), and the Slack calls a minute each channel received (counted by the local
Slack-compatible server), the busiest minute and the mean; and the rollout's wall time, its
steps' verdicts, the most steps and restarts at once, and the acknowledgement latency while it
ran.
"""

from __future__ import annotations

import argparse
import sqlite3
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench import fleet_rollout as rollout
from bench.load import (
    CHANNEL,
    INTERVAL_S,
    SLACK,
    ProcStat,
    away_from_bot,
    bring_up,
    db_bytes,
    drive,
    start_fleet,
    start_servers,
    stop_all,
    table_bytes,
    twin_lines,
)
from tests.bot.harness import wait_until
from tests.ports import free_port
from tests.slackfake import FakeSlack

# how long the sampler keeps each table's rows by default (bot/app/config/schedule.py)
KEPT_S = {"samples": 2 * 3600.0, "metric_samples": 3 * 86400.0, "metric_gaps": 3 * 86400.0}


def write_config(
    path: Path, fleet: list[int], sglang: int, twins: list[int], members: list[int]
) -> None:
    """`bench.load`'s configuration with `engine = "vllm"` past the first `sglang` servers of
    the fleet, and the rollout's group of `members`."""
    lines = [
        "[kvpilot]", "time_scale = 1", "", "[sampler]", f"interval_s = {INTERVAL_S:g}", "",
        "[gate]", "scrape_s = 10", "batch_s = 60", "", SLACK, *rollout.group_lines(),
    ]  # fmt: skip
    for i, port in enumerate(fleet):
        lines += [f"[servers.fleet{i:02d}]", f'url = "http://127.0.0.1:{port}"']
        if i >= sglang:
            lines.append('engine = "vllm"')
        lines.append("")
    for i, port in enumerate(twins):
        lines += twin_lines(i, port)
    for i, port in enumerate(members):
        lines += rollout.member_lines(i, port)
    path.write_text("\n".join(lines))


def steady_state(db_path: Path, before: dict[str, int], after: dict[str, int], wall: float) -> str:
    """The database at steady state: each table (with its indexes) that the sampler expires
    grows for its retention (`KEPT_S`) at the rate measured, then stays; what else grew (the
    settings snapshots, written at first contact) is counted once, as it is now."""
    conn = sqlite3.connect(db_path)
    try:
        owner = dict(conn.execute("SELECT name, tbl_name FROM sqlite_master").fetchall())
    finally:
        conn.close()
    rate: dict[str, float] = {}
    size: dict[str, int] = {}
    for name, now in after.items():
        table = str(owner.get(name, name))
        size[table] = size.get(table, 0) + now
        rate[table] = rate.get(table, 0.0) + (now - before.get(name, 0)) / wall
    steady = sum(
        rate[t] * KEPT_S[t] if t in KEPT_S else size[t] for t in size
    )  # fmt: skip
    kept = ", ".join(f"{t} {rate[t] * KEPT_S[t] / 2**20:.0f} MiB" for t in KEPT_S if t in rate)
    return f"steady state with retention applied: {steady / 2**20:.0f} MiB ({kept})"


def rounds(db_path: Path, since: float) -> str:
    """How long each round over the fleet took: from the first server's k-th sample after
    `since` to the last one's (`bench.load`'s figure needs a round within half an interval)."""
    conn = sqlite3.connect(db_path)
    try:
        rows = conn.execute(
            "SELECT server, ts FROM metric_samples WHERE ts >= ? AND server LIKE 'fleet%' "
            "ORDER BY ts",
            [since],
        ).fetchall()
    finally:
        conn.close()
    by_server: dict[str, list[float]] = {}
    for server, ts in rows:
        by_server.setdefault(str(server), []).append(float(ts))
    spans = []
    for k in range(min((len(v) for v in by_server.values()), default=0)):
        kth = [v[k] for v in by_server.values()]
        spans.append(max(kth) - min(kth))
    if not spans:
        return "rounds over the fleet: none complete"
    return (
        f"rounds over the fleet ({len(by_server)} servers sampled): "
        + ", ".join(f"{x:.1f}" for x in spans)
        + " s"
    )


def slack_rates(slack: FakeSlack, since: float, until: float) -> str:
    """Slack Web API calls a minute into each channel over [since, until], busiest minute and
    mean, for every call and for each method (Slack's limits are per method: `chat.postMessage`
    about one a second per channel, `chat.update` Tier 3, `chat.postEphemeral` Tier 4)."""
    minutes = max((until - since) / 60.0, 1e-9)
    per: dict[tuple[str, str], Counter[int]] = {}
    for call in slack.calls():
        channel = call.params.get("channel")
        if not isinstance(channel, str) or not since <= call.at <= until:
            continue
        minute = int((call.at - since) // 60)
        per.setdefault((channel, "every call"), Counter())[minute] += 1
        per.setdefault((channel, call.method), Counter())[minute] += 1
    if not per:
        return "Slack calls: none carried a channel"
    return "Slack calls a minute by channel: " + ", ".join(
        f"{ch} {what} {max(c.values())} in the busiest minute, {sum(c.values()) / minutes:.0f} "
        "a minute on average"
        for (ch, what), c in sorted(per.items())
    )


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fleet_load")
    p.add_argument("--servers", type=int, default=500, help="the fleet, the group included")
    p.add_argument("--experiments", type=int, default=5)
    p.add_argument("--group", type=int, default=100, help="servers in [groups.rollout]")
    p.add_argument("--rate", type=float, default=50.0, help="slash commands a second")
    p.add_argument("--seconds", type=float, default=600.0, help="how long commands arrive")
    ns = p.parse_args()
    if not 2 <= ns.group <= ns.servers:
        p.error("--group must be at least 2 and at most --servers")
    away_from_bot()
    recorded = ns.servers - ns.group
    sglang = recorded - recorded // 2
    names = [rollout.member(i) for i in range(ns.group)]
    with tempfile.TemporaryDirectory() as tmp, FakeSlack() as slack:
        base = Path(tmp)
        fleet_proc, ports_file = start_fleet(base, sglang, recorded - sglang)
        bots: list[subprocess.Popen[bytes]] = []
        config = base / "kvpilot.toml"
        twins = [free_port() for _ in range(ns.experiments)]
        members = [free_port() for _ in range(ns.group)]
        try:
            wait_until(ports_file.exists, 120, "the fleet")
            fleet = [int(x) for x in ports_file.read_text().split()]
            write_config(config, fleet, sglang, twins, members)
            print(f"fleet of {len(fleet)} up ({sglang} SGLang, {len(fleet) - sglang} vLLM); "
                  f"starting the group's {ns.group} servers", flush=True)  # fmt: skip
            err = start_servers(config, names, 8)
            if err:
                raise RuntimeError(f"a server of the group did not start: {err}")
            print(f"group up; starting {ns.experiments} twins", flush=True)
            driver, db_path = bring_up(config, slack, ns.experiments, bots)
            source = rollout.keep_on_first(driver, slack, db_path)
            print(f"{rollout.CHANGE} kept on {names[0]} (experiment {source}); rolling it out "
                  "to the group as commands arrive", flush=True)  # fmt: skip
            rollout.start_rollout(driver, slack)
            tables0, t0 = table_bytes(db_path), time.time()
            sent: list[tuple[float, float]] = []
            stat = ProcStat(bots[0].pid)
            sampled = rollout.outside_group
            print(drive(driver, stat, ns, db_path, len(fleet), sent, sampled), flush=True)
            t1 = time.time()
            print(rounds(db_path, t0))
            print(f"database after the run: {db_bytes(db_path) / 2**20:.1f} MiB; "
                  + steady_state(db_path, tables0, table_bytes(db_path), t1 - t0))  # fmt: skip
            print(slack_rates(slack, t0, t1), f"(alerts and replies in {CHANNEL})", flush=True)
            print(rollout.figures(db_path, sent, t0), flush=True)
        finally:
            stop_all(bots[0] if bots else None, config, ns.experiments, names)
            fleet_proc.kill()
            fleet_proc.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
