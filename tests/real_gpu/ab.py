"""The `ab` phase: two configurations under the same closed-loop load, each measured over a
steady window after its warm-up, read as kvpilot reads a server (its engine client's snapshots).
Each reading keeps kvpilot's whole stored snapshot and each side the server's own info, so the
predictions kvpilot would make from one side's window can be held against the other side later.

One side takes about a server start, the warm-up and the window; two sides of five-minute windows
do not fit one 10-minute call, so `--ab-side a` and `--ab-side b` run them in two calls and
`python3 -m tests.real_gpu.results` compares the two files.
"""

from __future__ import annotations

import time
from typing import Any

from playbooks.engines import engine_named
from playbooks.engines.base import EngineError
from tests.real_gpu.call import Call
from tests.real_gpu.load import Load
from tests.real_gpu.phases import start_failure, start_server
from tests.real_gpu.results import compare, side_summary
from tests.real_sglang.harness import RealSGLangError

SCRAPE_S = 5.0  # between two readings, at most a tenth of the window
SNAPSHOT_FIELDS = (
    "running",
    "queued",
    "kv_usage",
    "decode_rate",
    "decoded_tokens",
    "generated_tokens",
    "completed_requests",
    "preemptions",
    "capacity_tokens",
)


def measure(call: Call, side: str) -> dict[str, Any]:
    s = call.settings
    index = 0 if side == "a" else 1
    fraction, extra = s.ab_fractions[index], s.ab_extra[index]
    try:
        server = start_server(call, fraction, extra)
    except RealSGLangError as exc:
        return {
            "fraction": fraction,
            "extra": list(extra),
            **start_failure(call, exc, f"ab-{side}"),
        }
    record: dict[str, Any] = {
        "fraction": fraction,
        "extra": list(extra),
        "startup_s": round(server.startup_s or 0.0, 1),
        "gpu": call.machine.gpu(),
        "profile": s.ab_profile,
        "profile_options": list(s.ab_profile_options),
    }
    load = None
    client = engine_named("sglang").connect(server.url)
    try:
        record["max_total_num_tokens"] = client.settings().capacity_tokens
        record["server_info"] = server.server_info()  # whole: what kvpilot predicts from
        load = Load.start(
            call.machine, server.url, s.clients, call.work, s.ab_profile, s.ab_profile_options
        )
        began = time.time()
        record["window"] = [began + s.ab_warmup_s, began + s.ab_warmup_s + s.ab_steady_s]
        call.say(
            f"  {s.clients} clients on; warm-up {s.ab_warmup_s:g} s, then a "
            f"{s.ab_steady_s:g} s window"
        )
        samples: list[dict[str, Any]] = []
        while time.time() < record["window"][1] and load.running():
            try:
                snap = client.snapshot()
                samples.append(
                    {
                        "t": time.time(),
                        **{k: getattr(snap, k) for k in SNAPSHOT_FIELDS},
                        "metrics": snap.to_json(),  # whole, so a prediction can be made from it
                    }
                )
            except EngineError as exc:
                samples.append({"t": time.time(), "error": str(exc)})
            time.sleep(min(SCRAPE_S, s.ab_steady_s / 10))
        record["samples"] = samples
    finally:
        client.close()
        if load is not None:
            record["load"] = load.stop()
        record["stop"] = server.stop()
    record["status"] = "ok" if record.get("load", {}).get("completed") else "failed"
    return record


def ab(call: Call) -> dict[str, Any]:
    s = call.settings
    sides: dict[str, Any] = {}
    for side in s.ab_runs:
        call.say(f"A/B side {side}")
        sides[side] = measure(call, side)
    result: dict[str, Any] = {"phase": "ab", "side": s.ab_side, "sides": sides}
    summaries = {k: side_summary(v) for k, v in sides.items() if v.get("status") == "ok"}
    result["summaries"] = summaries
    for name, summary in summaries.items():
        call.say(
            f"  side {name} at {summary['fraction']:g}: decode {summary['decode_tokens_per_s']} "
            f"tok/s, running {summary['running']}, queued {summary['queued']}, client "
            f"{summary['client_tokens_per_s']} tok/s"
        )
    if "a" in summaries and "b" in summaries:
        result["compare"] = compare(summaries["a"], summaries["b"])
    ok = all(v.get("status") == "ok" for v in sides.values())
    result["status"] = "ok" if ok else "failed"
    return result
