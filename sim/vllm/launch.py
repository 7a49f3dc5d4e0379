"""`python -m sim.vllm serve MODEL [flags]`: start the vLLM twin like `vllm serve`.

Start-up follows vLLM 0.32's order and lines on the simulated clock (version, non-default args,
model loading, available KV memory, KV cache size, engine init, server address), taking the
preset's start-up time. A configuration vLLM refuses ends the process with exit status 1 and
vLLM's message; a bad flag exits 2 (argparse).
"""

from __future__ import annotations

import asyncio
import logging
import sys

import uvicorn
from prometheus_client import enable_created_metrics
from starlette.applications import Starlette
from starlette.routing import Route
from uvicorn.logging import AccessFormatter, DefaultFormatter

from sim.runtime import SimClock, wedge_on_sigusr1
from sim.vllm import logfmt as lf
from sim.vllm.args import ConfigError, VllmConfig, resolve
from sim.vllm.logfmt import VllmLog
from sim.vllm.memory import (
    KvPlan,
    StartupError,
    engine_killed_by_host_oom,
    engine_name,
    format_gib,
    kv_size_line,
    plan_kv,
)
from sim.vllm.runtime import VllmRuntime, make_log
from sim.vllm.server import VLLM_VERSION, VllmApp

PROG = "vllm serve"


class _NoBindLine(logging.Filter):
    """vLLM hands uvicorn a bound socket, so the real log has no "Uvicorn running on" line
    (tests/real_vllm/fixtures/server_log_default.txt)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Uvicorn running on")


def _configure_uvicorn_logging(log: VllmLog) -> None:
    """uvicorn's own layout, as vLLM leaves it: `INFO:     Started server process [N]`,
    `INFO:     Application startup complete.` and access lines
    `INFO:     127.0.0.1:N - "GET /health HTTP/1.1" 200 OK` (server_log_default.txt)."""
    plain = logging.StreamHandler(log.stream)
    plain.setFormatter(DefaultFormatter("%(levelprefix)s %(message)s", use_colors=False))
    plain.addFilter(_NoBindLine())
    access = logging.StreamHandler(log.stream)
    access.setFormatter(
        AccessFormatter(
            '%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s',
            use_colors=False,
        )
    )
    for name, handler in (("uvicorn", plain), ("uvicorn.error", plain), ("uvicorn.access", access)):
        logger = logging.getLogger(name)
        logger.handlers = [handler] if name != "uvicorn.error" else []
        logger.setLevel(logging.INFO)
        logger.propagate = name == "uvicorn.error"


def log_routes(log: VllmLog, app: Starlette) -> None:
    """`Available routes are:` and one `Route: PATH, Methods: M` line per route and method
    (startup_log_default.txt; `GET, HEAD` only for FastAPI's documentation routes, which the
    twin does not serve)."""
    log.emit("Available routes are:", lf.SITE_ROUTES_HEADER)
    for route in app.routes:
        if isinstance(route, Route):
            for method in sorted(route.methods or ()):
                log.emit(f"Route: {route.path}, Methods: {method}", lf.SITE_ROUTE)


def engine_failed(log: VllmLog, exc_type: str, message: str) -> None:
    """v1/engine/core.py:1510 then the API server's RuntimeError (v1/engine/utils.py:1431)."""
    log.emit(
        "EngineCore failed to start.\nTraceback (most recent call last):\n"
        '  File "vllm/v1/engine/core.py", line 1499, in run_engine_core\n'
        "    engine_core = EngineCoreProc(*args, **kwargs)\n"
        f"{exc_type}: {message}",
        lf.SITE_ENGINE_FAILED,
        engine=True,
        level="ERROR",
    )
    log.stream.write(
        "Traceback (most recent call last):\n"
        '  File "vllm/entrypoints/cli/main.py", line 75, in main\n'
        "    args.dispatch_function(args)\n"
        "RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {'EngineCore': 1}\n"
    )
    log.stream.flush()


class HostOomKill(Exception):
    """The host ran out of memory pinning KV offload buffers: the kernel killed an engine."""

    def __init__(self, engine: str) -> None:
        super().__init__(engine)
        self.engine = engine


def engine_killed(log: VllmLog, name: str) -> None:
    """An engine core ended by the kernel's OOM killer: no traceback of its own, only the API
    server's RuntimeError with the process's exit code (v1/engine/utils.py:1431)."""
    log.stream.write(
        "Traceback (most recent call last):\n"
        '  File "vllm/entrypoints/cli/main.py", line 75, in main\n'
        "    args.dispatch_function(args)\n"
        "RuntimeError: Engine core initialization failed. See root cause above. "
        f"Failed core proc(s): {{'{name}': -9}}\n"
    )
    log.stream.flush()


async def _sim_sleep(clock: SimClock, seconds: float) -> None:
    await asyncio.sleep(clock.wall_seconds(seconds))


async def startup(cfg: VllmConfig, log: VllmLog, clock: SimClock) -> KvPlan:
    """The engine core's start-up; raises StartupError where vLLM fails."""
    t = cfg.preset.base.startup_s
    start = clock.now()
    await _sim_sleep(clock, 0.5 * t)
    mem = cfg.preset.base.memory
    log.emit(
        f"Model loading took {format_gib(mem.weights_gib * (1 << 30))} GiB memory and "
        f"{0.5 * t:.6f} seconds",
        lf.SITE_MODEL_LOADING,
        engine=True,
    )
    plan = plan_kv(cfg)
    if plan.overridden_from is not None:
        log.emit(
            f"Overriding num_gpu_blocks={plan.overridden_from} with "
            f"num_gpu_blocks_override={plan.num_gpu_blocks}",
            lf.SITE_OVERRIDE,
            engine=True,
        )
    log.emit(
        f"Available KV cache memory: {format_gib(plan.available_bytes)} GiB",
        lf.SITE_AVAILABLE_KV,
        engine=True,
    )
    log.emit(kv_size_line(plan, cfg.max_model_len), lf.SITE_KV_SIZE, engine=True)
    killed = engine_killed_by_host_oom(cfg)
    if killed is not None:
        raise HostOomKill(engine_name(cfg, killed))
    await _sim_sleep(clock, 0.5 * t)
    log.emit(
        f"init engine (profile, create kv cache, warmup model) took {clock.now() - start:.2f} s",
        lf.SITE_INIT_ENGINE,
        engine=True,
    )
    return plan


async def serve(cfg: VllmConfig) -> int:
    # vLLM's exposition has a `_created` gauge per counter and histogram
    # (tests/real_vllm/fixtures/metric_families.txt); sim.metrics switches those off
    # process-wide for the SGLang twin, and this process serves only vLLM.
    enable_created_metrics()  # type: ignore[no-untyped-call]
    clock = SimClock(cfg.time_scale)
    log = make_log(clock)
    # the banner names the model path, not the served name (startup_log_default.txt)
    for row in lf.banner_rows(VLLM_VERSION, cfg.model):
        log.emit(row, lf.SITE_VERSION)
    log.emit(f"non-default args: {cfg.non_default}", lf.SITE_ARGS)
    # No "Chunked prefill is enabled with max_num_batched_tokens=N." line: 0.32 does not log it
    # at INFO (absent from tests/real_vllm/fixtures/startup_log_*.txt, chunked prefill on).
    try:
        plan = await startup(cfg, log, clock)
    except StartupError as exc:
        engine_failed(log, exc.exc_type, exc.message)
        return 1
    except HostOomKill as exc:
        engine_killed(log, exc.engine)
        return 1
    rt = VllmRuntime(cfg, plan, log, clock)
    host = cfg.host
    if cfg.dev_mode:
        log.emit(
            "SECURITY WARNING: Development endpoints are enabled! "
            "This should NOT be used in production!",
            lf.SITE_DEV_MODE,
            level="WARNING",
        )
    log.emit(f"Starting vLLM server on http://{host}:{cfg.port}", lf.SITE_START)
    app = VllmApp(rt).build()
    log_routes(log, app)
    _configure_uvicorn_logging(log)
    config = uvicorn.Config(
        app,
        host=host,
        port=cfg.port,
        log_config=None,
        access_log=True,
        timeout_keep_alive=5,
        # lifespan on: uvicorn logs "Application startup complete.", the line kvpilot waits
        # for (startup_log_default.txt: the first /health 200 comes after it)
        lifespan="on",
    )
    server = uvicorn.Server(config)
    rt.status = "up"
    if cfg.workload and cfg.concurrency:
        rt.start_workload(cfg.workload, cfg.concurrency)
    drive = asyncio.create_task(rt.drive())
    wedge_on_sigusr1(rt, drive, lambda text: log.emit(text, lf.SITE_START))
    try:
        await server.serve()
    finally:
        drive.cancel()
    if not server.started:
        log.emit(f"could not bind {host}:{cfg.port}; is the port in use?", lf.SITE_START)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg = resolve(args, prog=PROG)
    except ConfigError as exc:
        sys.stderr.write(
            f"Traceback (most recent call last):\n  ...\n{exc.exc_type}: {exc.message}\n"
        )
        return 1
    try:
        return asyncio.run(serve(cfg))
    except KeyboardInterrupt:
        return 0
