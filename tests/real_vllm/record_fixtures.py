"""Start the real vLLM server and record what it shows into ``fixtures/``.

Usage (any Python 3.11+, standard library only; needs ``setup.sh`` to have run)::

    python -m tests.real_vllm.record_fixtures [--out DIR] [--only default|capped|runtime]
        [--case NAME ...]   # with --only runtime: re-run these RUNTIME_CASES only

Every server is started through ``launch.py`` (so the command is ``vllm serve MODEL ...`` with
the launcher's CPU defaults) plus ``--served-model-name tiny-llama``, on 127.0.0.1 only, with
``VLLM_SERVER_DEV_MODE=1`` and ``VLLM_LOG_STATS_INTERVAL=1``, each in its own session. This process
is a child subreaper; on the way out it sends SIGTERM to the server's process group, waits up to
30 s, then SIGKILLs the group and reaps every process of the session.

``default`` server (launcher defaults, ``--kv-cache-memory-bytes 64M``):
    ``startup_log_default.txt`` (log until ``/health`` answered 200), ``metrics_idle_start.txt``,
    ``version.json``, ``models.json``, ``server_info.json`` (``?config_format=json``),
    ``server_info_text.json``, ``probes.json`` (status of a list of paths), ``completions.json``
    (requests with ``ignore_eos`` and ``max_tokens``, a chat completion, ``/tokenize``),
    ``completion_stream.txt`` (raw SSE), ``metrics_idle_after.txt``, ``server_log_default.txt``
    (the whole log, shutdown included).
``capped`` server (``--num-gpu-blocks-override 17 --max-model-len 2048``: 16 usable blocks of 128
tokens = 2048 tokens):
    ``startup_log_capped.txt``, ``metrics_idle_capped.txt``, then ``LOAD_REQUESTS`` concurrent
    requests of ``LOAD_PROMPT`` prompt tokens and ``LOAD_MAX_TOKENS`` output tokens (7 blocks
    each at the end): ``metrics_loaded.txt`` (the scrape with the most waiting requests),
    ``metrics_loaded_preempting.txt`` (first scrape with waiting > 0 after a preemption),
    ``load_timeline.json`` (every scrape's running/waiting/usage/preemptions),
    ``load_requests.json``, ``metrics_after_load.txt``, ``server_log_capped.txt``.
``runtime`` (one server start per flag edit in ``RUNTIME_CASES``, each of which vLLM's parser
and ``create_engine_config`` accept): ``runtime_checks.json`` (ready or exit status, the log's KV
and error lines, the log tail when it did not come up).
All: ``stats_log_lines.txt`` (the periodic ``Engine 000:`` lines), ``metric_families.txt``,
``routes.txt`` (from the start-up log; ``routes_openapi.txt`` from ``/openapi.json``),
``measurements.json`` (start-up seconds to ``/health`` 200, RSS per process, idle CPU, shutdown
seconds, KV lines). Each server's ``/tmp/vllm_dist_*`` file store is removed after it stops.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tests.ports import free_port

HERE = Path(__file__).resolve().parent
LAUNCH = HERE / "launch.py"
HOST = "127.0.0.1"
MODEL_NAME = "tiny-llama"
START_TIMEOUT_S = 600.0
STOP_GRACE_S = 30.0

LOAD_REQUESTS = 8
LOAD_PROMPT = 384  # 3 blocks of 128
LOAD_MAX_TOKENS = 512  # prompt + output = 896 tokens = 7 blocks
CAPPED_ARGS = ["--num-gpu-blocks-override", "17", "--max-model-len", "2048"]

PR_SET_CHILD_SUBREAPER = 36
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


# ---- /proc helpers -------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after "comm" (which may contain spaces): state ppid pgrp session ...
    return raw[raw.rindex(")") + 2 :].split()


def session_pids(sid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields and int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry.name))
    return sorted(pids)


def proc_info(pid: int) -> dict[str, Any]:
    info: dict[str, Any] = {"pid": pid}
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        name = re.search(r"^Name:\s*(.*)$", status, re.M)
        info["name"] = name.group(1) if name else "?"
        rss = re.search(r"^VmRSS:\s*(\d+) kB", status, re.M)
        info["rss_mib"] = round(int(rss.group(1)) / 1024, 1) if rss else 0.0
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        info["cmdline"] = cmd[:200]
    except OSError:
        pass
    return info


def cpu_seconds(pids: Sequence[int]) -> float:
    total = 0
    for pid in pids:
        fields = _stat_fields(pid)
        if fields:
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _CLK_TCK


# ---- HTTP ----------------------------------------------------------------------------------


def http(
    port: int, method: str, path: str, body: Any = None, timeout: float = 300.0
) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{HOST}:{port}{path}", data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def metric(text: str, name: str) -> float:
    """Sum of the samples of ``name`` (NaN when absent)."""
    vals = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + "{", name + " "))
    ]
    return sum(vals) if vals else float("nan")


# ---- the server ----------------------------------------------------------------------------


class Server:
    def __init__(self, name: str, args: Sequence[str], workdir: Path) -> None:
        self.name = name
        self.port = free_port()
        self.args = [*args, "--port", str(self.port), "--served-model-name", MODEL_NAME]
        self.log_path = workdir / f"server_log_{name}.txt"
        self.env = {
            **os.environ,
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_LOG_STATS_INTERVAL": "1",
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None
        self.startup_log = ""
        self.shutdown_s: float | None = None

    def command(self) -> str:
        out = subprocess.run(
            [sys.executable, str(LAUNCH), *self.args, "--kvpilot-print"],
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()

    def start(self, allow_exit: bool = False) -> int | None:
        """Launch and wait for ``/health`` 200 (returns None), or for the server to exit (raises,
        or with ``allow_exit`` returns its exit status)."""
        t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(LAUNCH), *self.args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        while True:
            if self.proc.poll() is not None:
                self.startup_s = round(time.monotonic() - t0, 2)
                if allow_exit:
                    return self.proc.returncode
                raise RuntimeError(
                    f"{self.name}: server exited with {self.proc.returncode}:\n"
                    + self.log_path.read_text()[-6000:]
                )
            if time.monotonic() - t0 > START_TIMEOUT_S:
                raise RuntimeError(f"{self.name}: no /health 200 after {START_TIMEOUT_S} s")
            with contextlib.suppress(OSError):
                if http(self.port, "GET", "/health", timeout=2)[0] == 200:
                    break
            time.sleep(0.25)
        self.startup_s = round(time.monotonic() - t0, 2)
        self.startup_log = self.log_path.read_text()
        return None

    def pids(self) -> list[int]:
        return session_pids(self.proc.pid) if self.proc else []

    def stop(self) -> None:
        if self.proc is None:
            return
        sid = self.proc.pid
        t0 = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(sid, signal.SIGTERM)
        while session_pids(sid) and time.monotonic() - t0 < STOP_GRACE_S:
            _reap()
            time.sleep(0.1)
        self.shutdown_s = round(time.monotonic() - t0, 2)
        left = session_pids(sid)
        if left:
            self.shutdown_s = None  # did not end on SIGTERM within the grace period
            with contextlib.suppress(ProcessLookupError):
                os.killpg(sid, signal.SIGKILL)
            for pid in left:  # members that left the process group
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while session_pids(sid) and time.monotonic() < deadline:
            _reap()
            time.sleep(0.05)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        _reap()
        self.proc = None
        # The worker's torch.distributed init uses a file store
        # (`distributed_init_method=file:///tmp/vllm_dist_<uuid>`) that is left behind.
        with contextlib.suppress(OSError):
            for path in re.findall(r"distributed_init_method=file://(\S+)", self.log_text()):
                Path(path).unlink(missing_ok=True)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


@contextlib.contextmanager
def running(server: Server) -> Iterator[Server]:
    try:
        server.start()
        yield server
    finally:
        server.stop()


# ---- recording -----------------------------------------------------------------------------


def write(out: Path, name: str, content: Any) -> None:
    path = out / name
    if isinstance(content, str):
        path.write_text(content if content.endswith("\n") else content + "\n")
    else:
        path.write_text(json.dumps(content, indent=2) + "\n")


def log_lines(text: str, pattern: str) -> list[str]:
    return [line for line in text.splitlines() if re.search(pattern, line)]


KV_LINE_PATTERN = (
    r"KV cache size|Explicitly set|Auto set|Overriding num_gpu_blocks|Maximum concurrency"
    r"|init engine|non-default args|vLLM server version|Starting vLLM"
    r"|OpenMP thread binding|Using .*backend|Application startup complete"
)


def logged_routes(log: str) -> list[str]:
    """``METHOD path`` for every ``Route: PATH, Methods: A, B`` line of the start-up log (the full
    list; ``/openapi.json`` leaves out the routes registered with ``include_in_schema=False``)."""
    out = set()
    for path, methods in re.findall(r"Route: (\S+), Methods: (.*)$", log, re.M):
        for method in methods.split(","):
            out.add(f"{method.strip():6} {path}")
    return sorted(out)


def metric_families(text: str) -> list[str]:
    """``name type`` of every ``# TYPE`` line of an exposition."""
    return sorted(
        " ".join(line.split()[2:4]) for line in text.splitlines() if line.startswith("# TYPE ")
    )


def idle_cpu(server: Server, seconds: float) -> float:
    pids = server.pids()
    c0, t0 = cpu_seconds(pids), time.monotonic()
    time.sleep(seconds)
    return round(100.0 * (cpu_seconds(pids) - c0) / (time.monotonic() - t0), 1)


def _completion(prompt: Any, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        **extra,
    }


def _record_surface(out: Path, port: int) -> None:
    """Info endpoints, routes and a status probe of a list of paths."""
    for name, path in (
        ("version.json", "/version"),
        ("models.json", "/v1/models"),
        ("server_info.json", "/server_info?config_format=json"),
        ("server_info_text.json", "/server_info"),
    ):
        status, body = http(port, "GET", path)
        reply = json.loads(body) if status == 200 else {"status": status, "body": body}
        write(out, name, reply)
    spec = json.loads(http(port, "GET", "/openapi.json")[1])
    routes = sorted(
        f"{method.upper():6} {path}"
        for path, ops in spec.get("paths", {}).items()
        for method in ops
    )
    write(out, "routes_openapi.txt", "\n".join(routes))
    probes = []
    for method, path in (
        ("GET", "/health"),
        ("GET", "/ping"),
        ("GET", "/load"),
        ("GET", "/version"),
        ("GET", "/v1/models"),
        ("GET", "/server_info"),
        ("GET", "/get_server_info"),
        ("GET", "/is_sleeping"),
        ("GET", "/kv_event_sources"),
        ("GET", "/tokenizer_info"),
        ("POST", "/reset_prefix_cache"),
        ("GET", "/health_generate"),
        ("GET", "/v1/loads"),
    ):
        status, text = http(port, method, path, timeout=30)
        probes.append({"method": method, "path": path, "status": status, "body": text[:300]})
    write(out, "probes.json", probes)


def _record_requests(out: Path, port: int) -> None:
    calls: list[dict[str, Any]] = []
    for path, req in (
        ("/v1/completions", _completion("The server queue is", 16)),
        ("/v1/completions", _completion("Tell me about the prefix cache and the block pool", 200)),
        ("/v1/completions", _completion(list(range(10, 110)), 50)),
        (
            "/v1/chat/completions",
            {
                "model": MODEL_NAME,
                "messages": [{"role": "user", "content": "hello world"}],
                "max_tokens": 16,
                "ignore_eos": True,
                "temperature": 0,
            },
        ),
        ("/tokenize", {"model": MODEL_NAME, "prompt": "The server queue is"}),
    ):
        t0 = time.monotonic()
        status, text = http(port, "POST", path, req)
        calls.append(
            {
                "path": path,
                "request": req,
                "status": status,
                "seconds": round(time.monotonic() - t0, 3),
                "response": json.loads(text) if text.startswith("{") else text,
            }
        )
    write(out, "completions.json", calls)
    stream_req = _completion("hello", 4, stream=True, stream_options={"include_usage": True})
    write(out, "completion_stream.txt", http(port, "POST", "/v1/completions", stream_req)[1])


def record_default(out: Path, meas: dict[str, Any]) -> None:
    server = Server("default", [], out)
    m: dict[str, Any] = {"command": server.command()}
    meas["default"] = m
    with running(server):
        m["startup_s_to_health_200"] = server.startup_s
        write(out, "startup_log_default.txt", server.startup_log)
        write(out, "routes.txt", "\n".join(logged_routes(server.startup_log)))
        port = server.port
        m["processes"] = [proc_info(p) for p in server.pids()]
        m["rss_total_mib"] = round(sum(p.get("rss_mib", 0) for p in m["processes"]), 1)
        m["idle_cpu_percent_10s"] = idle_cpu(server, 10)
        write(out, "metrics_idle_start.txt", http(port, "GET", "/metrics")[1])
        _record_surface(out, port)
        _record_requests(out, port)
        time.sleep(3)  # let the periodic stats line after traffic appear
        write(out, "metrics_idle_after.txt", http(port, "GET", "/metrics")[1])
        m["idle_cpu_percent_10s_after_traffic"] = idle_cpu(server, 10)
        m["processes_after_traffic"] = [proc_info(p) for p in server.pids()]
        m["rss_total_mib_after_traffic"] = round(
            sum(p.get("rss_mib", 0) for p in m["processes_after_traffic"]), 1
        )
    m["shutdown_s_sigterm"] = server.shutdown_s
    m["log_key_lines"] = log_lines(server.startup_log, KV_LINE_PATTERN)
    full = server.log_path.read_text()
    meas.setdefault("stats_lines", {})["default"] = log_lines(full, r"Engine 000:")


def _load_request(port: int, i: int, results: list[dict[str, Any]]) -> None:
    # Distinct prompts (no shared prefix blocks).
    prompt = [10 + (i * 131 + j * 7) % 1000 for j in range(LOAD_PROMPT)]
    t0 = time.monotonic()
    status, text = http(
        port, "POST", "/v1/completions", _completion(prompt, LOAD_MAX_TOKENS), timeout=900
    )
    res: dict[str, Any] = {"i": i, "status": status, "seconds": round(time.monotonic() - t0, 2)}
    try:
        body = json.loads(text)
        res["finish_reason"] = body["choices"][0]["finish_reason"]
        res["usage"] = body["usage"]
    except (ValueError, KeyError, IndexError):
        res["body"] = text[:500]
    results.append(res)


def _drive_load(server: Server, out: Path, m: dict[str, Any]) -> None:
    port = server.port
    results: list[dict[str, Any]] = []
    threads = [
        threading.Thread(target=_load_request, args=(port, i, results), daemon=True)
        for i in range(LOAD_REQUESTS)
    ]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    timeline: list[dict[str, Any]] = []
    best: tuple[float, str] | None = None
    preempting: str | None = None
    peak_rss: dict[int, float] = {}
    while any(t.is_alive() for t in threads):
        text = http(port, "GET", "/metrics", timeout=30)[1]
        row = {
            "t": round(time.monotonic() - t0, 2),
            "running": metric(text, "vllm:num_requests_running"),
            "waiting": metric(text, "vllm:num_requests_waiting"),
            "kv_cache_usage_perc": metric(text, "vllm:kv_cache_usage_perc"),
            "preemptions": metric(text, "vllm:num_preemptions_total"),
        }
        timeline.append(row)
        if best is None or row["waiting"] >= best[0]:
            best = (row["waiting"], text)
        if preempting is None and row["preemptions"] > 0 and row["waiting"] > 0:
            preempting = text
        for info in (proc_info(p) for p in server.pids()):
            pid, rss = info["pid"], info.get("rss_mib", 0.0)
            peak_rss[pid] = max(peak_rss.get(pid, 0.0), rss)
        time.sleep(0.5)
    for t in threads:
        t.join()
    m["load_wall_s"] = round(time.monotonic() - t0, 2)
    m["peak_rss_mib_by_pid"] = peak_rss
    m["peak_rss_total_mib"] = round(sum(peak_rss.values()), 1)
    if best is not None:
        write(out, "metrics_loaded.txt", best[1])
        write(out, "metric_families.txt", "\n".join(metric_families(best[1])))
    if preempting is not None:
        write(out, "metrics_loaded_preempting.txt", preempting)
    write(out, "load_timeline.json", timeline)
    write(out, "load_requests.json", sorted(results, key=lambda r: r["i"]))


def record_capped(out: Path, meas: dict[str, Any]) -> None:
    server = Server("capped", CAPPED_ARGS, out)
    m: dict[str, Any] = {"command": server.command()}
    meas["capped"] = m
    with running(server):
        m["startup_s_to_health_200"] = server.startup_s
        write(out, "startup_log_capped.txt", server.startup_log)
        write(out, "metrics_idle_capped.txt", http(server.port, "GET", "/metrics")[1])
        _drive_load(server, out, m)
        time.sleep(3)
        write(out, "metrics_after_load.txt", http(server.port, "GET", "/metrics")[1])
    m["shutdown_s_sigterm"] = server.shutdown_s
    m["log_key_lines"] = log_lines(server.startup_log, KV_LINE_PATTERN)
    full = server.log_path.read_text()
    meas.setdefault("stats_lines", {})["capped"] = log_lines(full, r"Engine 000:")


# Flag edits whose outcome is only decided in the engine process (check_args.py accepts them all).
RUNTIME_CASES: list[tuple[str, list[str]]] = [
    ("block_size_7", ["--block-size", "7"]),
    ("block_size_16", ["--block-size", "16"]),
    ("block_size_64", ["--block-size", "64"]),
    ("kv_cache_dtype_fp8", ["--kv-cache-dtype", "fp8"]),
    ("kv_cache_memory_bytes_0", ["--kv-cache-memory-bytes", "0"]),
    # 8 blocks = 1024 tokens < max_model_len 4096.
    ("num_gpu_blocks_override_8", ["--num-gpu-blocks-override", "8"]),
    # No explicit KV size: the worker gets 0.1 of the NUMA node's memory minus its RSS.
    ("gpu_memory_utilization_0.1", ["--gpu-memory-utilization", "0.1"]),
]
RUNTIME_LINE_PATTERN = KV_LINE_PATTERN + r"|Error|error:|block_size|fp8|Traceback"


def record_runtime(out: Path, meas: dict[str, Any], only: Sequence[str] = ()) -> None:
    """Run ``RUNTIME_CASES`` (or the ones named in ``only``); results replace same-named entries
    of an existing ``runtime_checks.json``."""
    path = out / "runtime_checks.json"
    old = json.loads(path.read_text()) if only and path.exists() else []
    results = [r for r in old if r["name"] not in only]
    for name, args in RUNTIME_CASES:
        if only and name not in only:
            continue
        server = Server(f"runtime_{name}", args, Path(tempfile.mkdtemp(prefix="kvpilot-vllm-")))
        res: dict[str, Any] = {"name": name, "args": args}
        try:
            rc = server.start(allow_exit=True)
            res["startup_s"] = server.startup_s
            if rc is None:
                status, text = http(server.port, "POST", "/v1/completions", _completion("hi", 8))
                res["outcome"] = "ready"
                res["completion_status"] = status
                res["completion"] = json.loads(text) if text.startswith("{") else text[:500]
            else:
                res["outcome"] = "exited"
                res["exit_code"] = rc
        finally:
            server.stop()
            log = server.log_text()
            res["key_lines"] = log_lines(log, RUNTIME_LINE_PATTERN)[:40]
            if res.get("outcome") != "ready":
                res["log_tail"] = log.splitlines()[-25:]
            shutil.rmtree(server.log_path.parent, ignore_errors=True)
        results.append(res)
        order = [n for n, _ in RUNTIME_CASES]
        results.sort(key=lambda r: order.index(r["name"]) if r["name"] in order else len(order))
        write(out, "runtime_checks.json", results)
    meas["runtime_checks"] = [
        {k: r.get(k) for k in ("name", "outcome", "exit_code", "startup_s")} for r in results
    ]


def _machine() -> dict[str, Any]:
    mem = re.search(r"MemTotal:\s*(\d+)", Path("/proc/meminfo").read_text())
    return {
        "cpus": os.cpu_count(),
        "mem_total_gib": round(int(mem.group(1)) / 2**20, 2) if mem else None,
        "loadavg_at_start": Path("/proc/loadavg").read_text().split()[:3],
    }


def main(argv: Sequence[str]) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE / "fixtures")
    ap.add_argument("--only", choices=("default", "capped", "runtime"))
    ap.add_argument(
        "--case", action="append", default=[], help="with --only runtime: run only this case"
    )
    opts = ap.parse_args(argv)
    out: Path = opts.out
    out.mkdir(parents=True, exist_ok=True)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    # SIGTERM unwinds through the `finally` blocks that stop the server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    meas_path = out / "measurements.json"
    meas: dict[str, Any] = json.loads(meas_path.read_text()) if meas_path.exists() else {}
    meas["machine"] = _machine()
    try:
        if opts.only in (None, "default"):
            record_default(out, meas)
        if opts.only in (None, "capped"):
            record_capped(out, meas)
        if opts.only in (None, "runtime"):
            record_runtime(out, meas, opts.case)
    finally:
        write(out, "measurements.json", meas)
        blocks = [f"# {name}\n" + "\n".join(v) for name, v in meas.get("stats_lines", {}).items()]
        if blocks:
            write(out, "stats_log_lines.txt", "\n\n".join(blocks))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
