"""The `oom-probe` phase: does a high memory fraction run out of GPU memory under a long, full
load, and what did kvpilot say about it beforehand?

For each fraction (0.93, 0.95, 0.97 by default) SGLang is started, kvpilot's verdicts on the
other probe fractions are read from it (as `kvpilot diagnose --consider` would), then 200
closed-loop clients send long prompts (U(5000, 7000) tokens, the model's context being 8,192)
for `--probe-s` seconds: every request a long chunked prefill while the pool is full of long
histories, which is where activations peak. Every two seconds the phase reads whether the server
still runs, its gauges and the GPU's memory. A server that dies is judged by kvpilot's own
reading of SGLang's log (`playbooks/engines/sglang/signatures.py`). What SGLang logged about
dropping its prefill CUDA graph (0.5.17 does below 4 GiB free) is kept: a server that degrades
instead of crashing is what kvpilot must know about.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from playbooks.engines.sglang.signatures import exit_cause
from tests.real_gpu.call import Call, find_key
from tests.real_gpu.commands import LONG_PROFILE
from tests.real_gpu.load import Load
from tests.real_gpu.phases import start_failure, start_server
from tests.real_gpu.predict import predictions
from tests.real_gpu.server import Server
from tests.real_sglang.harness import RealSGLangError

POLL_S = 2.0
# SGLang 0.5.17's lines about CUDA graphs it gave up or could not fit, and about memory: how
# many of each, and the first, in full
DEGRADED = (
    "Disabling auto-selected prefill CUDA graph",
    "out of memory",
    "OutOfMemoryError",
    "KV cache pool is full",
    "Retract",
)


def degraded_lines(log: str) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for line in log.splitlines():
        for needle in DEGRADED:
            if needle in line:
                seen = found.setdefault(needle, {"count": 0, "first": line[:400]})
                seen["count"] += 1
    return found


def alive(server: Server) -> bool:
    return server.real.proc.poll() is None


def reading(server: Server, call: Call, began: float) -> dict[str, Any]:
    """One poll: the server's gauges (or why they could not be read) and the GPU's memory."""
    row: dict[str, Any] = {"t": round(time.monotonic() - began, 1), "alive": alive(server)}
    try:
        row.update(server.metrics()["gauges"])
    except (httpx.HTTPError, ValueError) as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"[:200]
    gpu = call.machine.gpu()
    if gpu is not None:
        row["gpu_used_gib"] = gpu["used_gib"]
    return row


def under_long_load(call: Call, server: Server) -> dict[str, Any]:
    """The long-context clients for --probe-s seconds, or until the server dies."""
    s = call.settings
    load = Load.start(call.machine, server.url, s.probe_clients, call.work, LONG_PROFILE)
    began = time.monotonic()
    samples: list[dict[str, Any]] = []
    try:
        while time.monotonic() - began < s.probe_s and load.running():
            samples.append(reading(server, call, began))
            if not samples[-1]["alive"]:
                break
            time.sleep(POLL_S)
    finally:
        report = load.stop()
    report.pop("finished", None)
    return {"samples": samples, "load": report, "seconds": round(time.monotonic() - began, 1)}


def peak(samples: list[dict[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in samples if isinstance(r.get(key), (int, float))]
    return max(values) if values else None


def verdict_of(record: dict[str, Any]) -> str:
    """`survived`, `out_of_memory`, `crashed` or `did_not_start`, in a word."""
    if record.get("status") == "failed" and "samples" not in record:
        return "did_not_start"
    if record.get("died"):
        return "out_of_memory" if "memory" in str(record.get("cause", "")) else "crashed"
    return "survived"


def probe_one(call: Call, fraction: float) -> dict[str, Any]:
    s = call.settings
    try:
        server = start_server(call, fraction)
    except RealSGLangError as exc:
        failed = {"fraction": fraction, **start_failure(call, exc, f"oom-{fraction:g}")}
        failed["cause"] = exit_cause(None, str(exc)).reason
        failed["verdict"] = verdict_of(failed)
        return failed
    record: dict[str, Any] = {"fraction": fraction, "startup_s": round(server.startup_s or 0, 1)}
    try:
        info = server.server_info()
        record["max_total_num_tokens"] = find_key(info, "max_total_num_tokens")
        record["max_running_requests"] = find_key(info, "max_running_requests")
        record["chunked_prefill_size"] = find_key(info, "chunked_prefill_size")
        record["gpu_after_start"] = call.machine.gpu()
        others = [f for f in dict.fromkeys(s.probe_fractions) if f != fraction]
        record["kvpilot"] = predictions(
            server.url, [*others, 0.85], call.machine.gpus if call.machine.local_gpus else None
        )
        call.say(
            f"  {s.probe_clients} long-context clients for {s.probe_s:g} s "
            f"(max_total_num_tokens {record['max_total_num_tokens']:,})"
        )
        record.update(under_long_load(call, server))
        record["died"] = not alive(server)
    finally:
        log = server.real.log_text()
        code = server.real.proc.poll()
        record["stop"] = server.stop()
    record["exit_code"] = code
    record["degraded"] = degraded_lines(log)
    if record.get("died"):
        record["cause"] = exit_cause(code, log[-20_000:]).reason
    samples = record.get("samples", [])
    record["peak"] = {
        k: peak(samples, k)
        for k in ("gpu_used_gib", "sglang:token_usage", "sglang:num_running_reqs")
    }
    record["verdict"] = verdict_of(record)
    record["status"] = "ok"
    call.say(
        f"  {fraction:g}: {record['verdict']}; peak GPU {record['peak']['gpu_used_gib']} GiB, "
        f"token usage {record['peak']['sglang:token_usage']}, load "
        f"{record.get('load', {}).get('completed')} completed, errors "
        f"{record.get('load', {}).get('errors')}"
    )
    return record


def oom_probe(call: Call) -> dict[str, Any]:
    s = call.settings
    probes: list[dict[str, Any]] = []
    for fraction in dict.fromkeys(s.probe_fractions):
        need = call.costs.start_s + call.costs.stop_s + s.probe_s + call.costs.drain_s
        if call.left_s() < need:
            probes.append({"fraction": fraction, "status": "skipped", "error": "no time left"})
            continue
        call.say(f"oom probe at mem_fraction_static={fraction:g}")
        probes.append(probe_one(call, fraction))
    ran = [p for p in probes if p.get("status") != "skipped"]
    return {
        "phase": "oom-probe",
        "profile": LONG_PROFILE,
        "clients": s.probe_clients,
        "probe_s": s.probe_s,
        "probes": probes,
        "verdicts": {f"{p['fraction']:g}": p.get("verdict", "skipped") for p in probes},
        "status": "ok" if ran and len(ran) == len(probes) else "failed",
    }
