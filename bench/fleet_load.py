"""One bot serving a fleet: `bench.load` at fleet size, half SGLang- and half vLLM-shaped.

    python -m bench.fleet_load [--servers 500] [--experiments 5] [--group 100] [--rate 50]
                               [--seconds 600]

What runs, as in `bench.load` (real time, loopback, the bot pinned to CPU 0 and the rest to the
other cores with `taskset`): `--servers` servers from one `bench.fleet` process, the first half
answering with the real SGLang 0.5.23's recorded bodies and the second half with the real vLLM
0.32.0's, all sampled every 15 s; `--experiments` incident twins, each with an approved
experiment measuring its baseline; `--group` of the fleet's servers (SGLang and vLLM alike)
configured as one `[groups.rollout]` (`max_concurrent_restarts = 10`), the shape a fleet
rollout runs over; and `--rate` signed slash commands a second for `--seconds`, open-loop.

Printed, beside `bench.load`'s figures (acknowledgement latency p50/p99, the sampler's lateness
and a round's duration, the bot's CPU and resident memory): the database's size after the run
and at steady state (each table's growth rate times how long the sampler keeps its rows, see
`steady_state`), and the Slack calls a minute each channel received (counted by the local
Slack-compatible server), the busiest minute and the mean.
"""

from __future__ import annotations

import argparse
import sqlite3
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

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
    stop_all,
    table_bytes,
    twin_lines,
)
from tests.bot.harness import wait_until
from tests.ports import free_port
from tests.slackfake import FakeSlack

# how long the sampler keeps each table's rows by default (bot/app/config/schedule.py)
KEPT_S = {"samples": 2 * 3600.0, "metric_samples": 3 * 86400.0, "metric_gaps": 3 * 86400.0}


def write_config(path: Path, fleet: list[int], sglang: int, twins: list[int], group: int) -> None:
    """`bench.load`'s configuration with `engine = "vllm"` past the first `sglang` servers and
    the first `group` servers in `[groups.rollout]`."""
    lines = [
        "[kvpilot]", "time_scale = 1", "", "[sampler]", f"interval_s = {INTERVAL_S:g}", "",
        "[gate]", "scrape_s = 10", "batch_s = 60", "", SLACK,
        "[groups.rollout]", "max_concurrent_restarts = 10", "",
    ]  # fmt: skip
    for i, port in enumerate(fleet):
        lines += [f"[servers.fleet{i:02d}]", f'url = "http://127.0.0.1:{port}"']
        if i >= sglang:
            lines.append('engine = "vllm"')
        if i < group:
            lines.append('group = "rollout"')
        lines.append("")
    for i, port in enumerate(twins):
        lines += twin_lines(i, port)
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
    p.add_argument("--servers", type=int, default=500, help="half SGLang-, half vLLM-shaped")
    p.add_argument("--experiments", type=int, default=5)
    p.add_argument("--group", type=int, default=100, help="servers in [groups.rollout]")
    p.add_argument("--rate", type=float, default=50.0, help="slash commands a second")
    p.add_argument("--seconds", type=float, default=600.0, help="how long commands arrive")
    ns = p.parse_args()
    away_from_bot()
    sglang = ns.servers - ns.servers // 2
    with tempfile.TemporaryDirectory() as tmp, FakeSlack() as slack:
        base = Path(tmp)
        fleet_proc, ports_file = start_fleet(base, sglang, ns.servers - sglang)
        bots: list[subprocess.Popen[bytes]] = []
        config = base / "kvpilot.toml"
        twins = [free_port() for _ in range(ns.experiments)]
        try:
            wait_until(ports_file.exists, 120, "the fleet")
            fleet = [int(x) for x in ports_file.read_text().split()]
            write_config(config, fleet, sglang, twins, min(ns.group, ns.servers))
            print(f"fleet of {len(fleet)} up ({sglang} SGLang, {len(fleet) - sglang} vLLM); "
                  f"starting {ns.experiments} twins", flush=True)  # fmt: skip
            driver, db_path = bring_up(config, slack, ns.experiments, bots)
            tables0, t0 = table_bytes(db_path), time.time()
            print(drive(driver, ProcStat(bots[0].pid), ns, db_path, len(fleet)), flush=True)
            t1 = time.time()
            print(rounds(db_path, t0))
            print(f"database after the run: {db_bytes(db_path) / 2**20:.1f} MiB; "
                  + steady_state(db_path, tables0, table_bytes(db_path), t1 - t0))  # fmt: skip
            print(slack_rates(slack, t0, t1), f"(alerts and replies in {CHANNEL})", flush=True)
        finally:
            stop_all(bots[0] if bots else None, config, ns.experiments)
            fleet_proc.kill()
            fleet_proc.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
