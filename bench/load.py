"""One bot under an operator's heaviest day: many servers sampled, experiments running, a report
being built and slash commands arriving steadily.

    python -m bench.load [--servers 50] [--experiments 3] [--rate 50] [--seconds 180]

What runs, all on loopback, in real time (time_scale 1):
- `--servers` SGLang-shaped servers from one process (`bench.fleet`: the real SGLang 0.5.23's
  recorded bodies, a 91 KB `/metrics` each), sampled by the bot every 15 s;
- `--experiments` incident twins (time scale 1) behind the process launcher, each with an
  approved experiment measuring its baseline (a scrape every 10 s);
- `kvpilot serve` in HTTP mode, with a local Slack-compatible server;
- `--rate` signed slash commands a second for `--seconds`, sent open-loop (each at its own
  time, whether or not the ones before were answered): status, history, help, and a diagnose
  of a fleet server (which does its work after the acknowledgement), plus `report --since 1h`
  every 30 s.

On two cores the bot is pinned to CPU 0 and everything else (the fleet, the twins, this load
generator) to CPU 1 (`taskset`), so that what is measured is the bot's own cost; with more
cores the others get the rest. Printed: the acknowledgement latency of every command (what
Slack waits for, 3 s at most), the sampler's lag (how late each server's sample came after the
one before, past the 15 s interval, and how long a round over every server took), the bot's
CPU and resident memory, and the database's growth, extrapolated to a day.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from bench.ack import serve_answers
from storage import experiments as store
from storage.db import open_db
from tests.bot.harness import SECRET, SlackDriver, buttons, wait_until
from tests.ports import free_port
from tests.slackfake import FakeSlack
from tests.twin_process import REPO

SLACK = '[slack]\napprovers = ["U2"]\noperators = ["U1"]\nchannels = ["C0OPS"]\n'
INTERVAL_S = 15.0
CHANNEL = "C0OPS"


def pinned(cpu: str, command: list[str]) -> list[str]:
    """`command` on CPU `cpu` where the machine has two cores or more and taskset exists."""
    if (os.cpu_count() or 1) < 2 or not Path("/usr/bin/taskset").exists():
        return command
    return ["/usr/bin/taskset", "-c", cpu, *command]


def others() -> str:
    n = os.cpu_count() or 1
    return "1" if n == 2 else f"1-{n - 1}"


def write_config(path: Path, fleet: list[int], twins: list[int]) -> None:
    lines = [
        "[kvpilot]", "time_scale = 1", "", "[sampler]", f"interval_s = {INTERVAL_S:g}", "",
        "[gate]", "scrape_s = 10", "batch_s = 60", "", SLACK,
    ]  # fmt: skip
    for i, port in enumerate(fleet):
        lines += [f"[servers.fleet{i:02d}]", f'url = "http://127.0.0.1:{port}"', ""]
    for i, port in enumerate(twins):
        lines += twin_lines(i, port)
    path.write_text("\n".join(lines))


def away_from_bot() -> None:
    """This load generator beside the fleet and the twins, away from the bot's CPU 0."""
    cpus = os.cpu_count() or 1
    if cpus >= 2:
        os.sched_setaffinity(0, set(range(1, cpus)))


def start_fleet(base: Path, sglang: int, vllm: int) -> tuple[subprocess.Popen[bytes], Path]:
    """`bench.fleet` away from the bot; the file its ports will be written to."""
    ports_file = base / "fleet.ports"
    fleet = subprocess.Popen(
        pinned(others(), [sys.executable, "-m", "bench.fleet", "--servers", str(sglang),
                          "--vllm", str(vllm), "--ports-file", str(ports_file)]),
        cwd=REPO,
    )  # fmt: skip
    return fleet, ports_file


def twin_lines(i: int, port: int) -> list[str]:
    """`[servers.twinI]`: an incident twin (time scale 1) behind the process launcher."""
    command = pinned(others(), [
        sys.executable, "-m", "sim.launch_server", "--preset", "llama-3.1-8b-h100",
        "--port", str(port), "--mem-fraction-static", "0.85", "--enable-metrics",
        "--time-scale", "1", "--workload", "incident", "--concurrency", "96",
    ])  # fmt: skip
    return [
        f"[servers.twin{i}]", f'url = "http://127.0.0.1:{port}"', "gpu_memory_gib = 79.65",
        "host_ram_gib = 256", f"[servers.twin{i}.launcher]", 'kind = "process"',
        f"command = {json.dumps(command)}", "",
    ]  # fmt: skip


def bring_up(
    config: Path, slack: FakeSlack, experiments: int, bots: list[subprocess.Popen[bytes]]
) -> tuple[SlackDriver, Path]:
    """The twins, then the bot (added to `bots`, for the caller to stop), then an approved
    experiment on each twin; the Slack driver and the bot's database."""
    err = start_twins(config, experiments)
    if err:
        raise RuntimeError(f"a twin did not start: {err}")
    bot, driver = start_bot(config, slack)
    bots.append(bot)
    db_path = config.parent / "var" / "kvpilot.db"
    print("bot up; proposing and approving", flush=True)
    approve_all(driver, slack, db_path, experiments)
    print(f"{experiments} experiments running; commands now", flush=True)
    return driver, db_path


def start_twins(config: Path, count: int) -> str:
    """Start `count` twins at once (each takes its preset's 45 s, in real time); what went
    wrong, or "" when every one is up."""
    return start_servers(config, [f"twin{i}" for i in range(count)], count)


def start_servers(config: Path, names: list[str], at_once: int) -> str:
    """`kvpilot server start` for each of `names`, `at_once` at a time; what went wrong, or ""
    when every one is up."""
    return server_each(config, "start", names, at_once, 300)


def server_each(config: Path, verb: str, names: list[str], at_once: int, wait_s: float) -> str:
    """`kvpilot server VERB` for each of `names`, `at_once` at a time; the first error, or ""."""
    failed = ""
    for i in range(0, len(names), max(1, at_once)):
        calls = [
            subprocess.Popen(
                [sys.executable, "-m", "bot.cli", "server", verb, "--server", name,
                 "--config", str(config)],
                cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )
            for name in names[i : i + at_once]
        ]  # fmt: skip
        for call in calls:
            _, err = call.communicate(timeout=wait_s)
            if call.returncode and not failed:
                failed = err or f"kvpilot server {verb} exited {call.returncode}"
        if failed and verb == "start":
            return failed
    return failed


def start_bot(config: Path, slack: FakeSlack) -> tuple[subprocess.Popen[bytes], SlackDriver]:
    """`kvpilot serve` in HTTP mode on CPU 0, against the local Slack; its log beside `config`."""
    port = free_port()
    env = {**os.environ, "SLACK_BOT_TOKEN": "xoxb-bench",
           "SLACK_SIGNING_SECRET": SECRET, "SLACK_API_URL": slack.api_url}  # fmt: skip
    env.pop("SLACK_APP_TOKEN", None)
    log = (config.parent / "bot.log").open("wb")
    bot = subprocess.Popen(
        pinned("0", [sys.executable, "-m", "bot.cli", "serve", "--config", str(config),
                     "--host", "127.0.0.1", "--port", str(port)]),
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    wait_until(lambda: serve_answers(port), 120, "kvpilot serve")
    return bot, SlackDriver(f"http://127.0.0.1:{port}/slack/events", slack)


def stop_all(
    bot: subprocess.Popen[bytes] | None, config: Path, twins: int, more: Sequence[str] = ()
) -> None:
    """Stop the bot (saying how long it took and what it logged), then the twins and the
    servers named in `more`, eight at a time."""
    if bot is not None:
        stopped = time.monotonic()
        bot.terminate()
        try:
            bot.wait(120)
            print(f"bot stopped {time.monotonic() - stopped:.1f} s after SIGTERM")
        except subprocess.TimeoutExpired:
            print("bot still running 120 s after SIGTERM: killed")
            bot.kill()
            bot.wait(10)
        print(_log_summary(config.parent / "bot.log"))
    server_each(config, "stop", [*(f"twin{i}" for i in range(twins)), *more], 8, 120)


class ProcStat:
    """CPU seconds and resident memory of a process and its children in its own session (the
    bot and, at fleet size, its sampler's process, `bot.reports.sampler_process`), from /proc.
    Servers the bot's launchers start run in sessions of their own and are not the bot's cost,
    nor are the ones it stopped and reaped (their time would be in its cutime, so that is left
    out: the sampler's process lives as long as the bot)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.tick = os.sysconf("SC_CLK_TCK")

    def _stat(self, pid: int) -> list[str]:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()

    def children(self) -> list[int]:
        """Live children in the process's own session (after the command's name: state, ppid,
        pgrp, session)."""
        session = self._stat(self.pid)[3]
        out = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    fields = self._stat(int(entry.name))
                    if int(fields[1]) == self.pid and fields[3] == session:
                        out.append(int(entry.name))
                except (OSError, IndexError, ValueError):  # gone meanwhile
                    continue
        return out

    def cpu_s(self) -> float:
        """The process's own and its live children's in its session."""
        own = self._stat(self.pid)
        ticks = int(own[11]) + int(own[12])
        for child in self.children():
            try:
                fields = self._stat(child)
            except OSError:
                continue
            ticks += int(fields[11]) + int(fields[12])
        return ticks / self.tick

    def rss_mib(self) -> float:
        """The process's resident memory plus its children's."""
        return sum(_rss_mib(pid) for pid in [self.pid, *self.children()])


def _rss_mib(pid: int) -> float:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0.0
    for line in lines:
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def db_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*") if p.is_file())


def table_bytes(path: Path) -> dict[str, int]:
    """Bytes each table and index takes in the database file (SQLite's dbstat)."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        rows = conn.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name").fetchall()
    finally:
        conn.close()
    return {str(name): int(size) for name, size in rows}


def growth(before: dict[str, int], after: dict[str, int], wall: float) -> str:
    """The tables that grew most, in MiB a day."""
    grew = sorted(((after.get(k, 0) - before.get(k, 0), k) for k in after), reverse=True)
    return ", ".join(
        f"{name} {size / wall * 86400 / 2**20:.0f}" for size, name in grew[:5] if size > 0
    )


def sampler_lag(
    db_path: Path, since: float, fleet: int, counted: Callable[[str], bool] = lambda _: True
) -> tuple[list[float], list[float]]:
    """Per server (those `counted`), how late each sample came after the one before (past the
    interval), and the length of each round (first to last server's sample), for samples after
    `since`."""
    db = open_db(db_path)
    try:
        rows = list(db.query("SELECT server, ts FROM metric_samples WHERE ts >= ? ORDER BY ts",
                             [since]))  # fmt: skip
    finally:
        db.close()
    by_server: dict[str, list[float]] = {}
    for r in rows:
        if counted(str(r["server"])):
            by_server.setdefault(r["server"], []).append(float(r["ts"]))
    late = [
        max(0.0, b - a - INTERVAL_S)
        for ts in by_server.values() for a, b in itertools.pairwise(ts)
    ]  # fmt: skip
    rounds: list[list[float]] = []
    for t in sorted(float(r["ts"]) for r in rows if str(r["server"]).startswith("fleet")):
        if rounds and t - rounds[-1][0] < INTERVAL_S / 2:
            rounds[-1].append(t)
        else:
            rounds.append([t])
    spans = [r[-1] - r[0] for r in rounds if len(r) == fleet]
    return late, spans


def percentile(values: list[float], p: int) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100)[p - 1]


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.load")
    p.add_argument("--servers", type=int, default=50)
    p.add_argument("--experiments", type=int, default=3)
    p.add_argument("--rate", type=float, default=50.0, help="slash commands a second")
    p.add_argument("--seconds", type=float, default=180.0, help="how long commands arrive")
    p.add_argument("--keep", type=Path, help="copy the bot's database here at the end")
    ns = p.parse_args()
    away_from_bot()
    with tempfile.TemporaryDirectory() as tmp, FakeSlack() as slack:
        base = Path(tmp)
        fleet_proc, ports_file = start_fleet(base, ns.servers, 0)
        bots: list[subprocess.Popen[bytes]] = []
        config = base / "kvpilot.toml"
        twins = [free_port() for _ in range(ns.experiments)]
        try:
            wait_until(ports_file.exists, 60, "the fleet")
            print(f"fleet of {ns.servers} up; starting {ns.experiments} twins", flush=True)
            fleet = [int(x) for x in ports_file.read_text().split()]
            write_config(config, fleet, twins)
            driver, db_path = bring_up(config, slack, ns.experiments, bots)
            stat = ProcStat(bots[0].pid)
            print(drive(driver, stat, ns, db_path, ns.servers), flush=True)
            if ns.keep is not None:
                conn = sqlite3.connect(db_path)
                try:
                    conn.execute("VACUUM INTO ?", [str(ns.keep)])
                finally:
                    conn.close()
        finally:
            stop_all(bots[0] if bots else None, config, ns.experiments)
            fleet_proc.kill()
            fleet_proc.wait(10)
    return 0


def _log_summary(path: Path) -> str:
    """How many lines the bot logged at each level (JSON lines), and its first warnings."""
    levels: dict[str, int] = {}
    notable: list[str] = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
            level, message = str(record["level"]), str(record["message"])
        except (ValueError, KeyError, TypeError):
            level, message = "TEXT", line
        levels[level] = levels.get(level, 0) + 1
        if level not in ("INFO", "DEBUG") and len(notable) < 5:
            notable.append(f"{level} {message[:300]}")
    return f"bot log: {levels}" + "".join(f"\n  {n}" for n in notable)


def approve_all(driver: SlackDriver, slack: FakeSlack, db_path: Path, count: int) -> None:
    """Propose a change to each twin and approve it: `count` experiments measuring."""
    for i in range(count):
        propose_and_approve(driver, slack, f"twin{i}", "mem_fraction_static=0.88")
    db = open_db(db_path)
    try:
        wait_until(lambda: len(store.active_experiments(db)) == count, 120, "the experiments")
    finally:
        db.close()


def propose_and_approve(driver: SlackDriver, slack: FakeSlack, server: str, change: str) -> None:
    """`/kvpilot propose SERVER CHANGE` by the operator U1, approved by the approver U2 with
    the proposal's button."""
    driver.slash(f"propose {server} {change}", user="U1")
    ts, msg = wait_until(
        lambda: next(
            ((t, m) for t, m in slack.messages(CHANNEL).items()
             if server in (m.get("text") or "") and "kvpilot.approve" in buttons(m)),
            None,
        ),
        120,
        f"the approval message of {server}",
    )  # fmt: skip
    driver.click("kvpilot.approve", buttons(msg)["kvpilot.approve"], user="U2", message_ts=ts)


def drive(
    driver: SlackDriver,
    stat: ProcStat,
    ns: argparse.Namespace,
    db_path: Path,
    fleet: int,
    sent: list[tuple[float, float]] | None = None,
    sampled: Callable[[str], bool] = lambda _: True,
) -> str:
    """Commands at `ns.rate` a second for `ns.seconds`, open-loop; the figures, as text. Each
    command's (wall time sent, seconds to its acknowledgement) goes into `sent` if given; the
    sampler's lateness counts the servers `sampled` says."""
    mix = ["status", "history", "help", *(f"diagnose fleet{i:02d}" for i in range(3))]
    total = int(ns.rate * ns.seconds)
    latencies: list[float] = []
    refused: list[str] = []
    lock = threading.Lock()
    rss: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(1.0):
            rss.append(stat.rss_mib())

    def one(i: int, due: float) -> None:
        time.sleep(max(0.0, due - time.monotonic()))
        text = "report --since 1h" if i % int(ns.rate * 30) == 0 else mix[i % len(mix)]
        start = time.perf_counter()
        try:
            code = driver.slash(text, user="U1").status_code
        except httpx.HTTPError as exc:
            code, text = 0, f"{text}: {exc.__class__.__name__}"
        took = time.perf_counter() - start
        with lock:
            latencies.append(took)
            if sent is not None:
                sent.append((time.time() - took, took))
            if code != 200:
                refused.append(f"{text}: HTTP {code}")

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    cpu0, bytes0, t0 = stat.cpu_s(), db_bytes(db_path), time.time()
    tables0 = table_bytes(db_path)
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=64) as pool:
        for i in range(total):
            pool.submit(one, i, start + i / ns.rate)
    wall = time.monotonic() - start
    cpu1, bytes1 = stat.cpu_s(), db_bytes(db_path)
    tables1 = table_bytes(db_path)
    stop.set()
    late, spans = sampler_lag(db_path, t0, fleet, sampled)
    db = open_db(db_path)
    try:
        states = [str(r.state) for r in store.active_experiments(db)]
    finally:
        db.close()
    lat = sorted(latencies)
    return "\n".join([
        f"{len(lat)} slash commands in {wall:.0f} s ({len(lat) / wall:.1f}/s), "
        f"{len(refused)} not answered 200{': ' + '; '.join(refused[:5]) if refused else ''}",
        f"ack latency: p50 {percentile(lat, 50) * 1000:.0f} ms, p99 "
        f"{percentile(lat, 99) * 1000:.0f} ms, max {lat[-1] * 1000:.0f} ms",
        f"sampler: {fleet + ns.experiments} servers every {INTERVAL_S:g} s; lateness past the "
        f"interval p99 {percentile(late, 99):.2f} s, max {max(late, default=0):.2f} s over "
        f"{len(late)} samples; a round over the fleet took median "
        f"{statistics.median(spans) if spans else float('nan'):.2f} s, max "
        f"{max(spans, default=float('nan')):.2f} s ({len(spans)} rounds)",
        f"bot (with its sampler's process, if any): CPU {(cpu1 - cpu0) / wall * 100:.0f}% of one "
        f"core, RSS max "
        f"{max(rss, default=0):.0f} MiB (last {rss[-1] if rss else 0:.0f} MiB)",
        f"database: {bytes1 / 2**20:.1f} MiB, grew {(bytes1 - bytes0) / 2**10:.0f} KiB in "
        f"{wall:.0f} s = {(bytes1 - bytes0) / wall * 86400 / 2**20:.0f} MiB a day; in the "
        f"file, MiB a day by table: {growth(tables0, tables1, wall)}",
        f"experiments still running at the end: {len(states)} ({', '.join(states)})",
    ])  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
