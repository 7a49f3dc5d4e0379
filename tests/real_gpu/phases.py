"""The `smoke` and `capacity` phases: start the real SGLang, read what it says about itself, and
ask kvpilot what it would predict from there.

Each phase returns its JSON (status "ok" or "failed", with the reason) and never leaves a server
running. A server that does not start is a failed phase with the tail of its log, not an
exception out of the runner.
"""

from __future__ import annotations

import json
import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from playbooks.engines import detect
from tests.real_gpu.call import Call, find_key
from tests.real_gpu.predict import predictions
from tests.real_gpu.results import capacity_rows
from tests.real_gpu.server import Server
from tests.real_sglang.harness import RealSGLangError

# Families the phases and kvpilot read; smoke fails if one is missing.
REQUIRED_FAMILIES = (
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:max_total_num_tokens",
    "sglang:gen_throughput",
    "sglang:token_usage",
)
INFO_KEYS = (
    "version",
    "mem_fraction_static",
    "max_total_num_tokens",
    "max_running_requests",
    "chunked_prefill_size",
    "max_prefill_tokens",
    "cuda_graph_max_bs",
    "context_length",
    "attention_backend",
    "sampling_backend",
    "memory_usage",
)


def start_server(call: Call, fraction: float, extra: tuple[str, ...] = ()) -> Server:
    call.say(f"starting SGLang at mem_fraction_static={fraction:g} {' '.join(extra)}".rstrip())
    timeout = max(30.0, min(call.machine.start_timeout_s, call.left_s() - 15.0))
    server = Server.start(call.machine, call.settings.port, fraction, extra, timeout)
    call.say(f"  ready in {server.startup_s:.0f} s at {server.url}")
    return server


def start_failure(call: Call, exc: RealSGLangError, name: str) -> dict[str, Any]:
    """A start that failed: its log kept, and the reason in one line with the tail."""
    call.machine.log_path(f"{name}-failed-start").write_text(str(exc))
    call.machine.wait_gpu_idle()
    first = str(exc).splitlines()[0]
    call.say(f"  SGLang did not start: {first}")
    return {"status": "failed", "error": first, "log_tail": str(exc)[-4000:]}


def keep_raw(call: Call, server: Server, name: str, info: dict[str, Any]) -> None:
    """The server's own answers, whole, for fixtures: its server info, its metrics and its load
    report (SGLang's step accounting), as the logs' `raw-NAME-*` files."""
    m = call.machine
    m.log_path(f"raw-{name}-server_info").write_text(json.dumps(info, indent=1, default=str))
    for path, what in (("/metrics", "metrics"), ("/v1/loads?include=all", "loads")):
        try:
            with server.client() as c:
                m.log_path(f"raw-{name}-{what}").write_text(c.get(path).text)
        except httpx.HTTPError as exc:
            m.log_path(f"raw-{name}-{what}").write_text(f"{type(exc).__name__}: {exc}")


def server_record(call: Call, server: Server, fraction: float, source: str) -> dict[str, Any]:
    """What a started server says about its capacity, and kvpilot's predictions from it."""
    info = server.server_info()
    keep_raw(call, server, f"{fraction:g}", info)
    s = call.settings
    targets = sorted({*s.capacity_fractions, s.target, s.fraction} - {fraction})
    predicted = predictions(
        server.url, targets, call.machine.gpus if call.machine.local_gpus else None
    )
    record = {
        "fraction": fraction,
        "source": source,
        "startup_s": round(server.startup_s or 0.0, 1),
        "max_total_num_tokens": predicted["capacity_tokens"],
        "sglang_pre_load_gib": server.pre_load_gib(),
        "gpu_after_start": call.machine.gpu(),
        "server_info": {k: find_key(info, k) for k in INFO_KEYS},
        "predictions": predicted,
    }
    call.say(
        f"  max_total_num_tokens {record['max_total_num_tokens']:,}; kvpilot predicts "
        + ", ".join(
            f"{t}: {v['predicted_max_total_num_tokens']}"
            for t, v in predicted["server"]["targets"].items()
        )
    )
    return record


def smoke(call: Call) -> dict[str, Any]:
    """Start, serve a few requests, read the metrics and the server info, stop."""
    s = call.settings
    try:
        server = start_server(call, s.fraction)
    except RealSGLangError as exc:
        return {"phase": "smoke", **start_failure(call, exc, "smoke")}
    checks: list[dict[str, Any]] = []
    result: dict[str, Any] = {"phase": "smoke"}
    try:
        record = server_record(call, server, s.fraction, "smoke")
        requests = smoke_requests(server)
        metrics = server.metrics()
        kv = kvpilot_view(server.url)
        info = record["server_info"]
        checks = [
            _check(
                "SGLang answers as 0.5.17",
                str(info.get("version", "")).startswith("0.5.17"),
                str(info.get("version")),
            ),
            _check(
                "every request generated exactly its max_new_tokens",
                all(r["completion_tokens"] == r["max_new_tokens"] for r in requests),
                f"{len(requests)} requests",
            ),
            _check(
                "the metrics kvpilot reads are exported",
                all(f in metrics["families"] for f in REQUIRED_FAMILIES),
                ", ".join(f for f in REQUIRED_FAMILIES if f not in metrics["families"]) or "all",
            ),
            _check(
                "kvpilot detects SGLang and reads its capacity",
                kv.get("engine") == "sglang"
                and kv.get("capacity_tokens") == record["max_total_num_tokens"],
                str(kv),
            ),
        ]
        call.smoke_server = record
        result.update(
            server={
                **info,
                "fraction": s.fraction,
                "startup_s": record["startup_s"],
                "max_total_num_tokens": record["max_total_num_tokens"],
            },
            record=record,
            requests=requests,
            metric_families=metrics["families"],
            gauges=metrics["gauges"],
            decode_counter=metrics["decoded_tokens"],
            kvpilot=kv,
        )
    except Exception as exc:  # any failure to read the server is what the phase found
        checks.append(_check("the server could be read", False, f"{type(exc).__name__}: {exc}"))
    finally:
        result["stop"] = server.stop()
    for c in checks:
        call.say(f"  {'ok' if c['ok'] else 'FAILED'}: {c['check']} ({c['detail'][:120]})")
    result["checks"] = checks
    result["status"] = "ok" if checks and all(c["ok"] for c in checks) else "failed"
    return result


def _check(name: str, ok: bool, detail: str) -> dict[str, Any]:
    return {"check": name, "ok": bool(ok), "detail": detail}


def smoke_requests(server: Server) -> list[dict[str, Any]]:
    """One request alone, then four at once: every id in range of the model's vocabulary."""
    rng = random.Random(7)

    def one(n_in: int, n_out: int) -> dict[str, Any]:
        ids = [rng.randrange(3, 128_000) for _ in range(n_in)]
        return {"max_new_tokens": n_out, **server.generate(ids, n_out)}

    done = [one(64, 32)]
    with ThreadPoolExecutor(4) as pool:
        done.extend(pool.map(lambda n: one(200 * n, 128), range(1, 5)))
    return done


def kvpilot_view(url: str) -> dict[str, Any]:
    """The engine kvpilot detects at `url` and one reading of its load, as kvpilot sees them."""
    client = detect(url)
    try:
        snap = client.snapshot()
        info = client.settings()
        return {
            "engine": client.engine.name,
            "version": info.version,
            "capacity_tokens": info.capacity_tokens,
            "snapshot": {
                k: getattr(snap, k)
                for k in ("running", "queued", "kv_usage", "decode_rate", "decoded_tokens")
            },
        }
    finally:
        client.close()


def capacity(call: Call) -> dict[str, Any]:
    """Each fraction's real capacity, and kvpilot's predictions of the others from it."""
    s = call.settings
    servers: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    reused = call.smoke_server if call.smoke_server and s.fraction in s.capacity_fractions else None
    if reused is not None:
        call.say(f"  {s.fraction:g}: measured by smoke's server")
        servers.append(reused)
    for fraction in s.capacity_starts(reused is not None):
        need = call.costs.start_s + call.costs.stop_s + call.costs.probe_s
        if call.left_s() < need:
            failures.append({"fraction": fraction, "error": "skipped: no time left in this call"})
            continue
        try:
            server = start_server(call, fraction)
        except RealSGLangError as exc:
            failures.append(
                {"fraction": fraction, **start_failure(call, exc, f"capacity-{fraction:g}")}
            )
            continue
        try:
            servers.append(server_record(call, server, fraction, "capacity"))
        finally:
            server.stop()
    servers.sort(key=lambda r: r["fraction"])
    return {
        "phase": "capacity",
        "status": "ok" if servers and not failures else "failed",
        "servers": servers,
        "failures": failures,
        "rows": capacity_rows(servers),
    }
