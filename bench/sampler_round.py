"""What storing one sampler round over a fleet costs the bot (a micro-benchmark).

    python -m bench.sampler_round [--servers 500] [--rounds 5] [--dir DIR]

`Sampler.sample_once()` over `--servers` servers whose scrapes return the real SGLang 0.5.23's
recorded `/metrics` (`tests/fixtures/sglang/real-0.5.23/metrics_2.txt`), parsed once here, its
counters advanced every round: the round's cost is the sampler's own (increases, gaps, both
sample tables) and the database's, not the network's or `prometheus_client`'s. One round first
(first contact, settings snapshots), then `--rounds` timed rounds on a database file in WAL mode
(`storage.open_db`, as the bot opens it) under `--dir` (a fresh temporary one by default: put it
on the disk the bot's database is on). Prints the median round's CPU seconds (this process)
and wall seconds, and the commits a round made.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bot.app.config import ServerConfig, parse
from bot.reports.sampler import Sampler, default_client
from playbooks.clock import ManualClock
from playbooks.engines.base import EngineClient, ServerSettings, Snapshot
from playbooks.engines.sglang.client import parse_metrics, parse_server_info
from playbooks.engines.sglang.metrics import snapshot_from_metrics
from storage.db import open_db

RECORDED = Path(__file__).resolve().parent.parent / "tests/fixtures/sglang/real-0.5.23"


class Recorded:
    """A server's client whose readings are the recorded ones, counters growing each scrape."""

    def __init__(self, inner: EngineClient, snapshot: Snapshot, info: ServerSettings) -> None:
        self.inner, self.reading, self.info, self.scrapes = inner, snapshot, info, 0

    def snapshot(self) -> Snapshot:
        self.scrapes += 1
        grown = 12_000.0 * self.scrapes
        r = self.reading
        return replace(
            r,
            generated_tokens=(r.generated_tokens or 0.0) + grown,
            prompt_tokens=(r.prompt_tokens or 0.0) + grown * 8,
            completed_requests=(r.completed_requests or 0.0) + grown / 3500,
        )

    def settings(self) -> ServerSettings:
        return self.info

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    where = Path(tempfile.mkdtemp(prefix="kvpilot-sampler-round-", dir=args.dir))
    snapshot = snapshot_from_metrics(parse_metrics((RECORDED / "metrics_2.txt").read_text()))
    info = parse_server_info(json.loads((RECORDED / "server_info.json").read_text()))
    servers = {
        f"s{i}": {"url": f"http://127.0.0.1:{30000 + i}", "engine": "sglang"}
        for i in range(args.servers)
    }
    config = parse({"servers": servers, "sampler": {"concurrency": 1}}, where / "kvpilot.toml")

    def client(server: ServerConfig) -> EngineClient:
        return Recorded(default_client(server), snapshot, info)

    clock = ManualClock()
    db = open_db(where / "kvpilot.db")
    sampler = Sampler(config, db, clock, client_factory=client)
    statements: list[str] = []
    db.conn.set_trace_callback(statements.append)
    sampler.sample_once()
    cpu, wall, commits = [], [], []
    for _ in range(args.rounds):
        clock.sleep(15.0)
        statements.clear()
        c, w = time.process_time(), time.perf_counter()
        outcomes = sampler.sample_once()
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
        commits.append(sum(s.strip().upper() == "COMMIT" for s in statements))
        assert all(o.ok for o in outcomes)
    print(
        f"{args.servers} servers, {args.rounds} rounds: a round's CPU "
        f"{statistics.median(cpu):.3f} s, wall {statistics.median(wall):.3f} s (medians), "
        f"{statistics.median(commits):.0f} commits; database {where / 'kvpilot.db'}"
    )
    db.close()


if __name__ == "__main__":
    main()
