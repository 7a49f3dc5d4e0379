"""A changed server still loading at the launcher's `ready_timeout_s` is reverted, and kvpilot
learns nothing about memory from it: the same change may be proposed again without --force.

The H100 twin (Llama-3.1-8B, 45 s to load, as SGLang took 37-54 s on that GPU) behind the
process launcher; the change adds a 300 GB hierarchical cache, whose host pool takes SGLang
about 31 s per 35 GB to pin (gpu-sglang.md), so the changed server needs some 310 s to start
against a `ready_timeout_s` of 200 s, while the unchanged one starts well within it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from playbooks.campaigns import after
from playbooks.campaigns.policy import choose_next
from playbooks.engines.types import Option
from storage import campaigns as campaign_store
from storage import experiments as store
from storage.db import open_db
from tests.playbooks.experiments.incident import Workspace
from tests.ports import free_port

SERVER = "h100"
SCALE = 20  # a second of the bot's or the twin's own overhead is 20 s on the clock
READY_TIMEOUT_S = 200
SLOW_CHANGE = ("enable_hierarchical_cache=true", "hicache_size=300")


@contextmanager
def h100_workspace(tmp_path: Path) -> Iterator[Workspace]:
    port = free_port()
    command = [
        *(sys.executable, "-m", "sim.launch_server", "--preset", "llama-3.1-8b-h100"),
        *("--port", str(port), "--mem-fraction-static", "0.85", "--enable-metrics"),
        *("--time-scale", str(SCALE), "--workload", "incident", "--concurrency", "64"),
    ]
    config = tmp_path / "kvpilot.toml"
    config.write_text(
        f"[kvpilot]\ntime_scale = {SCALE}\n"
        "[gate]\nbaseline_s = 60\nscrape_s = 2\nbatch_s = 10\n"
        f'[servers.{SERVER}]\nurl = "http://127.0.0.1:{port}"\n'
        "gpu_memory_gib = 79.65\nhost_ram_gib = 1024\n"
        f'[servers.{SERVER}.launcher]\nkind = "process"\nready_timeout_s = {READY_TIMEOUT_S}\n'
        f"command = {json.dumps(command)}\n"
    )
    w = Workspace(config, port)
    code, _, err = w.cli("server", "start", "--server", SERVER)
    assert code == 0, err
    try:
        yield w
    finally:
        w.cli("server", "stop", "--server", SERVER)


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Workspace]:
    with h100_workspace(tmp_path) as w:
        yield w


def experiment(ws: Workspace, *sets: str, force: bool = False) -> tuple[int, dict[str, Any], str]:
    code, out, err = ws.cli(
        "experiment", "--server", SERVER, "--set", *sets, "--yes", "--json",
        *(("--force",) if force else ()),
    )  # fmt: skip
    return code, (json.loads(out) if out.strip() else {}), err


def ready_after_s(ws: Workspace, exp_id: int) -> float:
    """How long the revert of experiment `exp_id` took to become ready, as recorded."""
    db = open_db(ws.config.parent / "var" / "kvpilot.db")
    (back,) = [m for m in store.transitions(db, exp_id) if m.to_state == store.State.reverted]
    return float(back.details["ready_after_s"])


def test_a_start_slower_than_the_ready_timeout_teaches_nothing(ws: Workspace) -> None:
    code, result, err = experiment(ws, *SLOW_CHANGE)
    assert code == 4, err  # reverted after a failure
    assert result["state"] == "reverted" and result["outcome"] == "reverted_after_failure"
    why = result["reason"]
    assert why.startswith("the changed server was still loading after "), why
    assert f"(ready_timeout_s is {READY_TIMEOUT_S} s)" in why, why
    assert "nothing was learnt about memory" in why, why
    assert f"raise `ready_timeout_s` in [servers.{SERVER}.launcher]" in why, why
    # what it was doing when kvpilot gave up: pinning the host pool it had just announced
    assert "host memory for hierarchical KV cache" in why.split("its last log line:")[1], why
    # how long the unchanged server took, measured on the revert
    took = ready_after_s(ws, result["id"])
    assert result["then"] == (
        "back on the last-known-good configuration: the unchanged server took "
        f"{took:.0f} s to become ready"
    )
    assert took < READY_TIMEOUT_S
    assert ws.info()["enable_hierarchical_cache"] is False

    db = open_db(ws.config.parent / "var" / "kvpilot.db")
    assert campaign_store.bounds_for(db, SERVER) == []
    assert "learnt:" not in err, err
    moves = store.transitions(db, result["id"])
    (gave_up,) = [m for m in moves if m.to_state == store.State.reverting]
    assert gave_up.details["failure"] == "timed_out", gave_up.details
    # past the deadline, as recorded to a tenth of a second: 200.04 s is stored as 200.0
    assert gave_up.details["starting_s"] >= READY_TIMEOUT_S, gave_up.details
    # a campaign proposes the same change again, without --force
    change = {"enable_hierarchical_cache": True, "hicache_size": 300}
    option = Option("the host pool", change, "recommended", None, (0.05, 0.1), "low", [])
    choice = choose_next([option], bounds=after.bounds_of(db, SERVER))
    assert choice.option == option and not choice.skipped, choice

    # and it runs again: this time the timeout says how long the unchanged server took
    code, again, err = experiment(ws, *SLOW_CHANGE)
    assert code == 4 and again["id"] != result["id"], err
    assert (
        f"; the unchanged server took {took:.0f} s to become ready when kvpilot last started it;"
    ) in again["reason"], again["reason"]
    assert campaign_store.bounds_for(db, SERVER) == []


def test_a_start_refused_for_memory_still_teaches_its_bound(ws: Workspace) -> None:
    # SGLang's "Not enough memory. Please try to increase --mem-fraction-static": the weights
    # leave no room for the KV cache, whatever the deadline
    code, result, err = experiment(ws, "mem_fraction_static=0.15", force=True)
    assert code == 4, err
    assert result["reason"].startswith(
        "the changed server did not start: the server exited before it was ready: the weights "
        "leave no GPU memory for the KV cache"
    ), result["reason"]
    assert "nothing was learnt" not in result["reason"]
    db = open_db(ws.config.parent / "var" / "kvpilot.db")
    [bound] = campaign_store.bounds_for(db, SERVER)
    assert (bound.arg, bound.limit, bound.above) == ("mem_fraction_static", 0.15, False)
    assert "did not start: refused by the engine for lack of memory" in bound.reason
    assert "learnt: mem_fraction_static <= 0.15" in err, err
    assert ws.info()["mem_fraction_static"] == 0.85
