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

from sim.runtime import SimClock
from sim.vllm import logfmt as lf
from sim.vllm.args import ConfigError, VllmConfig, resolve
from sim.vllm.logfmt import VllmLog
from sim.vllm.memory import KvPlan, StartupError, format_gib, kv_size_line, plan_kv
from sim.vllm.runtime import VllmRuntime, make_log
from sim.vllm.server import VLLM_VERSION, VllmApp

PROG = "vllm serve"


class _UvicornFormatter(logging.Formatter):
    def __init__(self, log: VllmLog) -> None:
        super().__init__()
        self.vlog = log

    def format(self, record: logging.LogRecord) -> str:
        return (
            f"(APIServer pid={self.vlog.api_pid}) {record.levelname} {self.vlog.timestamp()} "
            f"[{record.filename}:{record.lineno}] {record.getMessage()}"
        )


def _configure_uvicorn_logging(log: VllmLog) -> None:
    handler = logging.StreamHandler(log.stream)
    handler.setFormatter(_UvicornFormatter(log))
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.setLevel(logging.INFO)
        logger.propagate = False


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
    await _sim_sleep(clock, 0.5 * t)
    log.emit(
        f"init engine (profile, create kv cache, warmup model) took {clock.now() - start:.2f} s",
        lf.SITE_INIT_ENGINE,
        engine=True,
    )
    return plan


async def serve(cfg: VllmConfig) -> int:
    clock = SimClock(cfg.time_scale)
    log = make_log(clock)
    log.emit(
        f"vLLM server version {VLLM_VERSION}, serving model {cfg.served_model_name}",
        lf.SITE_VERSION,
    )
    log.emit(f"non-default args: {cfg.non_default}", lf.SITE_ARGS)
    log.emit(
        f"Chunked prefill is enabled with max_num_batched_tokens={cfg.max_num_batched_tokens}.",
        lf.SITE_CHUNKED,
    )
    try:
        plan = await startup(cfg, log, clock)
    except StartupError as exc:
        engine_failed(log, exc.exc_type, exc.message)
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
    _configure_uvicorn_logging(log)
    config = uvicorn.Config(
        VllmApp(rt).build(),
        host=host,
        port=cfg.port,
        log_config=None,
        access_log=True,
        timeout_keep_alive=5,
        lifespan="off",
    )
    server = uvicorn.Server(config)
    rt.status = "up"
    if cfg.workload and cfg.concurrency:
        rt.start_workload(cfg.workload, cfg.concurrency)
    drive = asyncio.create_task(rt.drive())
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
