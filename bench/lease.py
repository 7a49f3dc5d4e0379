"""What holding an experiment's lease costs: the check made before every restart, and one
renewal (the background thread makes one every 5 s).

    python -m bench.lease [--runs 500]

Each is a short-lived connection to the database file (open, conditional UPDATE, close), on a
real file in WAL mode as the bot uses it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from playbooks.experiments.ownership import Lease
from storage import acquire_lease, create_experiment, open_db


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=500)
    runs = parser.parse_args().runs
    path = Path(tempfile.mkdtemp(prefix="kvpilot-lease-")) / "kvpilot.db"
    db = open_db(path)
    exp = create_experiment(
        db, server="s", change={}, baseline_config={}, trial_config={}, settings={},
        actor="bench", now=datetime.now(UTC),
    )  # fmt: skip
    lease = Lease(lambda: open_db(path), exp)
    assert lease.acquire()
    checks, renewals = [], []
    for _ in range(runs):
        t = time.perf_counter()
        lease.check(sync=True)
        checks.append(time.perf_counter() - t)
        t = time.perf_counter()
        assert acquire_lease(db, exp, lease.owner, datetime.now(UTC), lease.ttl_s)
        renewals.append(time.perf_counter() - t)
    for name, xs in (
        ("check before a restart", checks),
        ("renewal on an open connection", renewals),
    ):
        xs.sort()
        p99 = xs[int(0.99 * (len(xs) - 1))]
        print(
            f"{name}: median {statistics.median(xs) * 1000:.2f} ms, "
            f"p99 {p99 * 1000:.2f} ms over {len(xs)} runs"
        )


if __name__ == "__main__":
    main()
