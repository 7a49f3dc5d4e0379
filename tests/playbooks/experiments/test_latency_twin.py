"""A latency target on the twin, end to end through the CLI: more throughput, a broken ITL target,
reverted with the numbers.

A Llama-3.1-8B server on an H100 serves short chats to 150 clients with
`--max-running-requests 16`: decode steps are short, every token comes within 10 ms (the p99
measured 10.0 ms), and the operator's target is `itl_p99_ms = 15`. Raising the cap to 128
more than triples the decode rate, but a step over 128 requests reads eight times the KV cache
and prefills more often, so inter-token latency doubles (p99 measured 22 ms, 95% 17-28 ms) and
leaves the target: the gate reverts the change as a guardrail, with the trial's p99 and its
interval in the reason. The same change without the target is kept (`test_experiment_twin.py`
shows keeps).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from storage import campaigns as campaign_store
from storage import experiments as store
from storage.db import open_db
from tests.playbooks.experiments.incident import Workspace
from tests.ports import free_port

# The gate judges both throughput and latency here, from batches of scrapes: at 50x the bot's
# scrapes stay about 10 simulated seconds apart on a busy two-core machine (at 100x they
# thinned out to one a minute or two, leaving batches without a reading at either end).
SCALE = 50


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Workspace]:
    port = free_port()
    command = [
        sys.executable, "-m", "sim.launch_server", "--preset", "llama-3.1-8b-h100",
        "--port", str(port), "--enable-metrics", "--max-running-requests", "16",
        "--time-scale", str(SCALE), "--workload", "short-chat", "--concurrency", "150",
    ]  # fmt: skip
    config = tmp_path / "kvpilot.toml"
    config.write_text(
        f"[kvpilot]\ntime_scale = {SCALE}\n\n[gate]\nscrape_s = 10\nbatch_s = 60\n\n"
        f'[servers.chat]\nurl = "http://127.0.0.1:{port}"\nitl_p99_ms = 15\n'
        '[servers.chat.launcher]\nkind = "process"\n'
        f"command = {json.dumps(command)}\n"
    )
    w = Workspace(config, port)
    code, _, err = w.cli("server", "start", "--server", "chat")
    assert code == 0, err
    try:
        yield w
    finally:
        w.cli("server", "stop", "--server", "chat")


def test_a_change_that_breaks_the_itl_target_is_reverted(ws: Workspace) -> None:
    code, out, err = ws.cli(
        "experiment", "--server", "chat", "--set", "max_running_requests=128", "--yes", "--json"
    )
    result: dict[str, Any] = json.loads(out) if out.strip() else {}
    assert code == 4, (err, result)  # reverted after a guardrail
    assert result["state"] == "reverted", result
    assert result["reason"].startswith("ITL p99 broke its 15.0 ms target: trial "), result
    assert "95% interval" in result["reason"] and "the whole interval above it" in result["reason"]
    assert ws.info()["max_running_requests"] == 16  # back on the last-known-good
    db = open_db(ws.config.parent / "var" / "kvpilot.db")
    stored = store.get_experiment(db, result["id"]).result
    assert stored is not None
    latency = stored["latency"]
    assert latency["slo_held"] is False
    [itl] = latency["targets"]
    assert (itl["target"], itl["limit"], itl["verdict"]) == ("itl_p99_ms", 15.0, "broken")
    assert itl["trial"]["ci"][0] > 15.0 > itl["baseline"]["p99"]
    # the throughput the change bought is reported beside it: a campaign reads both
    assert stored["effect"]["mean"] > 0.5
    assert stored["verdict"] == "guardrail"
    # a campaign maximises throughput subject to the target: the cap that broke it is a bound
    (bound,) = campaign_store.bounds_for(db, "chat")
    assert (bound.arg, bound.limit, bound.above) == ("max_running_requests", 128.0, True)
    assert "broke its latency target (itl_p99_ms)" in bound.reason
    assert "learnt: max_running_requests" in err
