"""A fleet of real twins: `kvpilot diagnose --group`, and concurrent experiments that never
restart more servers of a group at once than the group allows."""

from __future__ import annotations

import io
import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.app.config import load
from bot.app.wiring import database, experiment_deps, make_clock
from bot.app.wiring import launcher as wiring_launcher
from bot.cli import main
from playbooks.experiments import machine
from sim.models import LLAMA_3_1_8B, write_model_dir
from storage import audit
from storage import experiments as store
from storage.experiments import State
from tests.ports import free_port
from tests.twin_process import TwinProcess, spawn, wait_healthy

SCALE = 200
SERVERS = ("kimi-a", "kimi-b", "kimi-c")


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@contextmanager
def twins(variants: dict[str, list[str]]) -> Iterator[dict[str, TwinProcess]]:
    with ExitStack() as stack:
        started = {}
        for name, args in variants.items():
            twin = spawn(["--time-scale", str(SCALE), "--enable-metrics", *args])
            stack.callback(twin.log_path.unlink, missing_ok=True)
            stack.callback(twin.stop)
            started[name] = twin
        for twin in started.values():
            wait_healthy(twin)
        yield started


# Serial: three twins measured at once in a short window; next to the parallel tier a starved
# twin's window is too thin to name its bottleneck.
@pytest.mark.serial
def test_diagnose_a_group(tmp_path: Path) -> None:
    incident = ["--workload", "incident", "--concurrency"]
    variants = {
        "kimi-a": ["--mem-fraction-static", "0.85", *incident, "150"],
        "kimi-b": ["--mem-fraction-static", "0.88", *incident, "150"],
        "kimi-c": ["--mem-fraction-static", "0.85", *incident, "20"],
    }
    with twins(variants) as fleet:
        servers = "".join(
            f'[servers.{name}]\nurl = "{twin.url}"\ngroup = "kimi"\ngpu_memory_gib = 95.59\n'
            "host_ram_gib = 256\n\n"
            for name, twin in fleet.items()
        )
        config = tmp_path / "kvpilot.toml"
        config.write_text(
            f"[kvpilot]\ntime_scale = {SCALE}\n\n[groups.kimi]\n[groups.mixed]\n\n{servers}"
            '[servers.gone]\nurl = "http://127.0.0.1:9"\ngroup = "mixed"\n\n'
            f'[servers.kimi-a-too]\nurl = "{fleet["kimi-a"].url}"\ngroup = "mixed"\n'
        )
        started = time.monotonic()
        code, out, err = cli(
            "diagnose", "--group", "kimi", "--config", str(config), "--window", "300", "--json"
        )
        took = time.monotonic() - started
        assert code == 0, err
        report = json.loads(out)
        code, text, err = cli(
            "diagnose", "--group", "mixed", "--config", str(config), "--window", "120"
        )
        assert code == 1 and "error: gone could not be diagnosed: cannot reach SGLang" in err
    # measured side by side: three 300 s windows at 200x take about 1.5 s, not 4.5 s
    assert took < 8, took
    summary = report["summary"]
    assert summary["servers"] == 3 and summary["measured"] == 3 and summary["failed"] == []
    assert summary["bottlenecks"] == {"client": ["kimi-c"], "kv_cache": ["kimi-a", "kimi-b"]}
    found = {name: s["finding"] for name, s in report["servers"].items()}
    assert found["kimi-a"]["capacity"]["max_total_num_tokens"] == 116_171
    assert found["kimi-b"]["capacity"]["max_total_num_tokens"] == 159_856
    rates = {n: f["throughput"]["generation_tokens_per_s"] for n, f in found.items()}
    assert rates["kimi-b"] > rates["kimi-a"] > rates["kimi-c"]
    assert summary["generation_tokens_per_s_total"] == pytest.approx(sum(rates.values()), abs=0.1)
    changes = {c["server"]: c for c in summary["changes_to_try"]}
    assert changes["kimi-a"]["change"] == "chunked_prefill_size=4096, mem_fraction_static=0.89"
    assert changes["kimi-a"]["verdict"] == "recommended"
    assert changes["kimi-c"]["change"] == "raise client concurrency"
    assert all("scraped directly" in s["metrics_from"] for s in report["servers"].values())
    # the text form: one section per server, then the group side by side
    assert "== gone (http://127.0.0.1:9), metrics from" in text
    assert "== kimi-a-too (" in text
    assert "== group mixed: 1 of 2 servers measured" in text
    assert "gone             not measured: cannot reach SGLang" in text


# Serial, as above.
@pytest.mark.serial
def test_diagnose_a_group_of_sglang_and_vllm(tmp_path: Path) -> None:
    """One group, one server of each engine: each is read in its own engine's terms, and the
    group's summary puts them side by side."""
    model = write_model_dir(LLAMA_3_1_8B, tmp_path / "llama")
    sglang = spawn(
        ["--time-scale", "100", "--enable-metrics", "--mem-fraction-static", "0.85",
         "--workload", "incident", "--concurrency", "150"]
    )  # fmt: skip
    vllm = spawn(
        ["--engine", "vllm", "--time-scale", "100", "serve", str(model),
         "--preset", "llama-3.1-8b-h100", "--gpu-memory-utilization", "0.35",
         "--max-model-len", "32768", "--max-num-seqs", "64",
         "--workload", "incident", "--concurrency", "96"]
    )  # fmt: skip
    try:
        wait_healthy(sglang)
        wait_healthy(vllm)
        config = tmp_path / "kvpilot.toml"
        config.write_text(
            "[kvpilot]\ntime_scale = 100\n\n[groups.both]\n\n"
            f'[servers.kimi]\nurl = "{sglang.url}"\ngroup = "both"\ngpu_memory_gib = 95.59\n'
            "host_ram_gib = 256\n\n"
            f'[servers.llama]\nurl = "{vllm.url}"\ngroup = "both"\nengine = "vllm"\n'
            "gpu_memory_gib = 79.65\n"
        )
        code, out, err = cli(
            "diagnose", "--group", "both", "--config", str(config), "--window", "600", "--json"
        )
    finally:
        for twin in (sglang, vllm):
            twin.stop()
            twin.log_path.unlink(missing_ok=True)
    assert code == 0, err
    report = json.loads(out)
    summary = report["summary"]
    assert summary["measured"] == 2 and summary["failed"] == []
    assert summary["bottlenecks"] == {"kv_cache": ["kimi", "llama"]}
    found = {name: s["finding"] for name, s in report["servers"].items()}
    assert (found["kimi"]["engine"], found["llama"]["engine"]) == ("SGLang", "vLLM")
    assert found["kimi"]["capacity"]["max_total_num_tokens"] == 116_171
    assert found["llama"]["version"] == "0.32.0"
    changes = {c["server"]: c["change"] for c in summary["changes_to_try"]}
    assert changes == {
        "kimi": "chunked_prefill_size=4096, mem_fraction_static=0.89",
        "llama": "gpu_memory_utilization=0.95",
    }
    rates = [f["throughput"]["generation_tokens_per_s"] for f in found.values()]
    assert all(r and r > 0 for r in rates)  # vLLM's from its counter, SGLang's its gauge


@dataclass
class Downtime:
    """When each server was seen down (not answering /health), from outside kvpilot."""

    spans: dict[str, list[tuple[float, float]]]

    def overlapping(self) -> list[tuple[str, str]]:
        out = []
        names = sorted(self.spans)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                for a0, a1 in self.spans[a]:
                    for b0, b1 in self.spans[b]:
                        if a0 <= b1 and b0 <= a1:
                            out.append((a, b))
        return out


@contextmanager
def watch_health(urls: dict[str, str]) -> Iterator[Downtime]:
    seen = Downtime({name: [] for name in urls})
    stop = threading.Event()

    def watch() -> None:
        down_since: dict[str, float | None] = dict.fromkeys(urls)
        last_down: dict[str, float] = {}
        with httpx.Client(timeout=0.5) as http:
            while not stop.is_set():
                for name, url in urls.items():
                    t = time.monotonic()
                    try:
                        up = http.get(url + "/health").status_code == 200
                    except httpx.TimeoutException:
                        continue  # slow on a busy machine is not down: no reading
                    except httpx.TransportError:
                        up = False  # refused: the process is gone or not listening yet
                    if not up:
                        down_since[name] = down_since[name] or t
                        last_down[name] = t
                    elif down_since[name] is not None:
                        seen.spans[name].append((down_since[name] or t, last_down[name]))
                        down_since[name] = None
                stop.wait(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(timeout=5)


def restart_spans(db: Any, exp_id: int) -> list[tuple[str, str]]:
    """(started, ready) of each restart, as the audit log recorded them (UTC ISO text)."""
    events = audit.events(db, experiment_id=exp_id)
    starts = [e["created_at"] for e in events if e["name"] == "restart_started"]
    ends = [e["created_at"] for e in events if e["name"] == "restart_finished"]
    return list(zip(starts, ends, strict=True))


def test_concurrent_experiments_take_turns_to_restart(tmp_path: Path) -> None:
    ports = {name: free_port() for name in SERVERS}
    servers = ""
    for name, port in ports.items():
        command = [
            sys.executable,
            "-m",
            "sim.launch_server",
            "--port",
            str(port),
            "--preset",
            "llama-3.1-8b-h100",
            "--max-running-requests",
            "16",
            "--enable-metrics",
            "--time-scale",
            str(SCALE),
            "--workload",
            "incident",
            "--concurrency",
            "32",
        ]
        servers += (
            f'[servers.{name}]\nurl = "http://127.0.0.1:{port}"\ngroup = "kimi"\n'
            f'[servers.{name}.launcher]\nkind = "process"\ncommand = {json.dumps(command)}\n\n'
        )
    path = tmp_path / "kvpilot.toml"
    path.write_text(
        f"[kvpilot]\ntime_scale = {SCALE}\n\n"
        "[gate]\nscrape_s = 10\nbatch_s = 60\nbaseline_s = 360\n\n"
        f"[groups.kimi]\nmax_concurrent_restarts = 1\n\n{servers}"
    )
    config = load(str(path))
    clock = make_clock(config, database(config))  # one clock for the process, as a bot has
    launchers = {n: wiring_launcher(config, config.server(n), clock) for n in SERVERS}
    results: dict[str, store.ExperimentRow] = {}
    errors: list[BaseException] = []

    def run(name: str) -> None:
        db = database(config)  # each thread its own connection, as separate bots would have
        try:
            deps = experiment_deps(config, name, db, clock=clock)
            exp = machine.create(
                deps,
                {"max_running_requests": 24},
                actor="test",
                approved_by="test",
                reason="fleet test",
            )
            results[name] = machine.run(deps, exp)
        except BaseException as exc:
            errors.append(exc)
        finally:
            db.close()

    try:
        for launcher in launchers.values():
            launcher.start(launcher.current_args())
        for launcher in launchers.values():
            launcher.wait_ready()
        urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        with watch_health(urls) as downtime:
            workers = [threading.Thread(target=run, args=(n,)) for n in SERVERS]
            for w in workers:
                w.start()
            for w in workers:
                w.join(timeout=240)
    finally:
        for launcher in launchers.values():
            launcher.stop()
    assert not errors, errors
    assert sorted(results) == list(SERVERS)
    assert all(r.state in (State.kept, State.reverted) for r in results.values()), results
    db = database(config)
    spans = sorted(s for r in results.values() for s in restart_spans(db, r.id))
    assert len(spans) == 3  # one restart each
    for (_, end), (start, _) in pairwise(spans):
        assert end <= start, spans  # the next restart began only after the previous was ready
    waits = [
        e
        for r in results.values()
        for e in audit.events(db, experiment_id=r.id)
        if e["name"] == "note" and "waiting for a restart slot" in str(e)
    ]
    assert len(waits) >= 2  # the baselines ended together, so two of them had to wait
    assert sum(len(s) for s in downtime.spans.values()) >= 3
    assert downtime.overlapping() == [], downtime.spans
    rows = db.execute("SELECT COUNT(*) FROM restart_slots").fetchone()
    assert rows[0] == 0  # every slot given back
