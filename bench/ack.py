"""How fast the Slack bot acknowledges slash commands while an experiment runs.

    python -m bench.ack [--clients 50] [--rounds 5] [--scale 20] [--pause 5]

Starts the SGLang twin (incident preset, built-in load), a local Slack-compatible server and
`kvpilot serve` in HTTP mode as its own process on loopback; proposes and approves a change so
an experiment is measuring and restarting the server in the background; then fires
`--clients` signed `/kvpilot` commands at once (a mix of status, history, help, diagnose and
propose, the last two starting real work after the acknowledgement) and times each HTTP
response, which is what Slack waits for (3 s limit). Prints percentiles over all rounds.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from bot.cli import main as kvpilot
from storage import experiments as store
from storage.db import open_db
from tests.bot.harness import SECRET, SlackDriver, buttons, twin_config, wait_until
from tests.ports import free_port
from tests.slackfake import FakeSlack
from tests.twin_process import REPO

SLACK = '[slack]\napprovers = ["U2"]\noperators = ["U1"]\n'
MIX = [
    "status",
    "history",
    "help",
    "diagnose incident",
    "propose incident mem_fraction_static=0.86",
]


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ack")
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--scale", type=float, default=20.0)
    p.add_argument("--pause", type=float, default=5.0, help="seconds between rounds")
    ns = p.parse_args()
    latencies: list[float] = []
    states: list[str] = []
    with tempfile.TemporaryDirectory() as tmp, FakeSlack() as slack:
        path = twin_config(Path(tmp), free_port(), scale=ns.scale, slack=SLACK)
        out, err = io.StringIO(), io.StringIO()
        if kvpilot(["server", "start", "--server", "incident", "--config", str(path)], out, err):
            print(err.getvalue())
            return 1
        port = free_port()
        env = {
            **os.environ,
            "SLACK_BOT_TOKEN": "xoxb-bench",
            "SLACK_SIGNING_SECRET": SECRET,
            "SLACK_API_URL": slack.api_url,
        }
        env.pop("SLACK_APP_TOKEN", None)
        bot = subprocess.Popen(
            [sys.executable, "-m", "bot.cli", "serve", "--config", str(path), "--host",
             "127.0.0.1", "--port", str(port)],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            wait_until(lambda: serve_answers(port), 30, "kvpilot serve")
            driver = SlackDriver(f"http://127.0.0.1:{port}/slack/events", slack)
            driver.slash("propose incident mem_fraction_static=0.88")
            ts, msg = wait_until(
                lambda: next(
                    ((t, m) for t, m in slack.messages("C0OPS").items() if buttons(m)), None
                ),
                60,
                "the approval message",
            )
            driver.click(
                "kvpilot.approve", buttons(msg)["kvpilot.approve"], user="U2", message_ts=ts
            )
            db = open_db(path.parent / "var" / "kvpilot.db")
            wait_until(lambda: store.active_experiments(db), 30, "the experiment")
            for _ in range(ns.rounds):
                active = store.active_experiments(db)
                states.append(str(active[0].state) if active else "none")

                def one(i: int) -> float:
                    start = time.perf_counter()
                    r = driver.slash(MIX[i % len(MIX)], user="U1")
                    took = time.perf_counter() - start
                    if r.status_code != 200:
                        print(f"  {MIX[i % len(MIX)]!r}: HTTP {r.status_code} after {took:.2f} s")
                    return took

                with ThreadPoolExecutor(max_workers=ns.clients) as pool:
                    latencies += list(pool.map(one, range(ns.clients)))
                time.sleep(ns.pause)
        finally:
            bot.terminate()
            bot.wait(30)
            kvpilot(["server", "stop", "--server", "incident", "--config", str(path)], out, err)
    latencies.sort()
    q = statistics.quantiles(latencies, n=100)
    print(f"{len(latencies)} slash commands, {ns.clients} at once x {ns.rounds} rounds")
    print(f"experiment state during the rounds: {', '.join(states)}")
    print(
        f"ack latency: p50 {q[49] * 1000:.0f} ms, p95 {q[94] * 1000:.0f} ms, "
        f"p99 {q[98] * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms (Slack's limit: 3000 ms)"
    )
    return 0


def serve_answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    raise SystemExit(main())
