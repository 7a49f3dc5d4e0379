"""`python -m sim.launch_server`: start the SGLang twin like `python -m sglang.launch_server`.

The startup follows SGLang's order and log lines (weights, KV pool, CUDA graphs, the
hierarchical cache's host pool, the capacity summary, HTTP server, warm-up request, "The server
is fired up and ready to roll!"), taking the preset's startup time (or `--sim-startup-s`) in
simulated seconds, plus the host pool's pinning (`sim.memory.PIN_BYTES_PER_S`). Configurations
SGLang refuses fail the way SGLang fails: the scheduler's exception, "Received sigquit from a
child process...", and the process killing itself. Runtime OOMs (GPU activations, host RAM) end
the process under load.

`--engine vllm` hands the other flags to the vLLM twin (`sim.vllm.launch`, `vllm serve`'s flags).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from datetime import datetime

import httpx
import uvicorn

from sim.args import TwinConfig, resolve
from sim.engine import GpuOutOfMemory, HostOutOfMemory
from sim.logfmt import SimLog, rank_prefix
from sim.memory import PREFILL_GRAPH_GATE_GIB, Headroom, StartupFailure, headroom
from sim.runtime import Runtime, SimClock, wedge_on_sigusr1
from sim.server import TwinApp
from sim.vllm import launch as vllm_launch

WARMUP_TEXT = "The capital city of France is"
TORCH_DTYPES = {
    "bf16": "torch.bfloat16",
    "bfloat16": "torch.bfloat16",
    "fp16": "torch.float16",
    "float16": "torch.float16",
    "fp8_e4m3": "torch.float8_e4m3fn",
    "fp8_e5m2": "torch.float8_e5m2",
}


class _SimFormatter(logging.Formatter):
    """Uvicorn's lines with SGLang's `[timestamp] LEVEL:     message` layout on simulated time."""

    def __init__(self, log: SimLog) -> None:
        super().__init__()
        self.sim_log = log

    def format(self, record: logging.LogRecord) -> str:
        level = f"{record.levelname}:".ljust(9)
        return f"[{self.sim_log.timestamp()}] {level} {record.getMessage()}"


def _configure_uvicorn_logging(log: SimLog) -> None:
    handler = logging.StreamHandler(log.stream)
    handler.setFormatter(_SimFormatter(log))
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.setLevel(logging.INFO)
        logger.propagate = False


def die(log: SimLog, exc_type: str, message: str, prefix: str, where: str) -> None:
    """Print what SGLang prints when a scheduler process fails, then kill ourselves like it."""
    log.line(
        "Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "sglang/srt/managers/scheduler.py", line 2731, in run_scheduler_process\n'
        f"    {where}\n"
        f"{exc_type}: {message}\n",
        prefix,
    )
    log.line("Received sigquit from a child process. It usually means the child failed.")
    log.stream.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def killed_by_host_oom(log: SimLog) -> None:
    """The kernel's OOM killer sends SIGKILL: SGLang prints nothing of its own."""
    log.stream.flush()
    os.kill(os.getpid(), signal.SIGKILL)


async def _sleep_sim(clock: SimClock, seconds: float) -> None:
    await asyncio.sleep(clock.wall_seconds(seconds))
    clock.rebase(clock.now())


def _server_args_line(cfg: TwinConfig) -> str:
    shown = {k: ("<redacted>" if k == "api_key" and v else v) for k, v in cfg.server_args.items()}
    body = ", ".join(f"{k}={v!r}" for k, v in shown.items())
    return f"server_args=ServerArgs({body})"


async def _load_weights(rt: Runtime, prefix: str) -> float:
    """Distributed init and the weights; returns the simulated load time."""
    mem = rt.cfg.preset.memory
    load_time = rt.cfg.preset.startup_s * 0.8
    rt.log.line("Init torch distributed begin.", prefix)
    rt.log.line(
        "Init torch distributed ends. mem usage="
        f"{mem.gpu_memory_mib / 1024 - mem.free_before_load_gib:.2f} GB",
        prefix,
    )
    rt.log.line(f"Load weight begin. avail mem={mem.free_before_load_gib:.2f} GB", prefix)
    await _sleep_sim(rt.clock, load_time)
    if mem.weights_gib > mem.free_before_load_gib:
        raise StartupFailure(
            "torch.OutOfMemoryError", "CUDA out of memory while loading weights.", "load_weight"
        )
    avail = mem.free_before_load_gib - mem.weights_gib - mem.other_static_gib
    rt.log.line(
        f"Load weight end. type={rt.cfg.preset.model.architecture}, dtype=torch.bfloat16, "
        f"avail mem={avail:.2f} GB, mem usage={mem.weights_gib:.2f} GB.",
        prefix,
    )
    return load_time


def _allocate_kv_cache(rt: Runtime, prefix: str) -> float:
    """The KV pool; returns the GPU memory left. Raises the configuration's StartupFailure
    where SGLang fails here."""
    cfg, log = rt.cfg, rt.log
    mem, cap = cfg.preset.memory, cfg.capacity
    if cfg.failure is not None:
        raise cfg.failure
    for warning in cap.warnings:
        log.line(warning, prefix)
    kv_gb = cap.kv_cache_gib
    torch_dtype = TORCH_DTYPES.get(cfg.kv_dtype, cfg.kv_dtype)
    dtype_part = f"dtype: {torch_dtype}, " if cfg.version.refactored else ""
    if cfg.preset.model.is_mla:
        sizes = f"KV size: {kv_gb:.2f} GB"
    else:
        sizes = f"K size: {kv_gb / 2:.2f} GB, V size: {kv_gb / 2:.2f} GB"
    log.line(
        f"KV Cache is allocated. {dtype_part}#tokens: {cap.max_total_num_tokens}, {sizes}", prefix
    )
    reserve = mem.free_before_load_gib - mem.weights_gib - mem.other_static_gib - kv_gb
    log.line(f"Memory pool end. avail mem={reserve:.2f} GB", prefix)
    return reserve


async def _allocate_host_pool(rt: Runtime, prefix: str) -> None:
    """The hierarchical cache's host pool, after the CUDA graphs as in SGLang (the scheduler's
    `build_kv_cache` follows `init_model_worker`), taking the time its pinning takes; raises
    the StartupFailure SGLang raises when it does not fit."""
    pool = rt.plan_host_pool()
    if pool is None:
        return
    for line in pool.log_lines:
        rt.log.line(line, prefix)
    await _sleep_sim(rt.clock, pool.pin_s)


async def _capture_cuda_graphs(rt: Runtime, prefix: str, reserve: float) -> tuple[float, Headroom]:
    """CUDA graph capture; returns its simulated time and the memory left for activations."""
    cfg = rt.cfg
    mem = cfg.preset.memory
    mfs = float(cfg.server_args["mem_fraction_static"])
    host_pool = bool(cfg.server_args["enable_hierarchical_cache"])
    hr = headroom(cfg.preset, mfs, host_pool, cfg.capacity.kv_cache_gib, cfg.version)
    if hr.prefill_graph_skipped:  # SGLang 0.5.17's own warning, word for word
        rt.log.line(
            "Disabling auto-selected prefill CUDA graph: only "
            f"{hr.reserve_gib:.2f} GiB is free after model/KV/eager-buffer allocation; at "
            f"least {PREFILL_GRAPH_GATE_GIB:.2f} GiB is required for capture. Set an explicit "
            "prefill CUDA graph backend to override this safety gate.",
            prefix,
        )
    rt.prefill_graph_skipped = hr.prefill_graph_skipped
    rt.log.line(
        "Capture cuda graph begin. This can take up to several minutes. "
        f"avail mem={reserve:.2f} GB",
        prefix,
    )
    graph_time = cfg.preset.startup_s * 0.15
    await _sleep_sim(rt.clock, graph_time)
    if hr.activation_gib < mem.activation_base_gib:
        raise StartupFailure(
            "torch.OutOfMemoryError",
            f"CUDA out of memory. Tried to allocate {mem.graph_gib:.2f} GiB. GPU 0 has a total "
            f"capacity of {mem.gpu_memory_mib / 1024:.2f} GiB of which "
            f"{max(0.0, reserve - mem.graph_gib) * 1024:.2f} MiB is free.",
            "capture_cuda_graph",
        )
    rt.log.line(
        f"Capture cuda graph end. Time elapsed: {graph_time:.2f} s. mem usage="
        f"{hr.graph_gib:.2f} GB. avail mem={hr.activation_gib:.2f} GB.",
        prefix,
    )
    return graph_time, hr


def _capacity_line(cfg: TwinConfig, hr: Headroom) -> str:
    """SGLang's one-line summary of the scheduler's limits once start-up is done."""
    sa = cfg.server_args
    return (
        f"max_total_num_tokens={cfg.capacity.max_total_num_tokens}, "
        f"chunked_prefill_size={cfg.chunked_prefill_size}, "
        f"max_prefill_tokens={sa['max_prefill_tokens']}, "
        f"max_running_requests={cfg.max_running_requests}, "
        f"context_len={cfg.context_len}, "
        f"available_{'cpu' if sa['device'] == 'cpu' else 'gpu'}_mem={hr.activation_gib:.2f} GB"
    )


def _record_startup(rt: Runtime, load_time: float, graph_time: float, hr: Headroom) -> None:
    """What server info and the metrics report about start-up: phases, memory, the pool."""
    cfg = rt.cfg
    cap = cfg.capacity
    rt.startup_time = rt.clock.now()
    rt.startup_available_gib = hr.activation_gib
    rt.startup_phases = {
        "load_weight": load_time,
        "kv_cache_allocation": 0.05,
        "scheduler_e2e": rt.startup_time,
        "cuda_graph": {
            "prefill": 0.0,
            "decode": graph_time,
            "target_verify": 0.0,
            "draft_prefill": 0.0,
            "draft_decode": 0.0,
            "draft_extend": 0.0,
        },
        "tokenizer_e2e": rt.startup_time,
    }
    rt.metrics.static = {
        "engine_startup_time": rt.startup_time,
        "engine_load_weights_time": load_time,
        "kv_cache_memory_usage_gb": cap.kv_cache_gib,
        "weight_memory_usage_gb": cfg.preset.memory.weights_gib,
        "graph_memory_usage_gb": hr.graph_gib,
        "page_size": cfg.page_size,
        "num_pages": cap.max_total_num_tokens // cfg.page_size,
        "context_len": cfg.context_len,
        "startup_available_gpu_memory_gb": hr.activation_gib,
        "max_total_num_tokens": cap.max_total_num_tokens,
    }
    if cap.swa_tokens is not None:
        rt.metrics.static["max_total_num_tokens_swa"] = cap.swa_tokens
    rt.metrics.startup_phases = {
        k: float(v) for k, v in rt.startup_phases.items() if isinstance(v, (int, float))
    }
    for rank in range(rt.dp_size):
        rt.metrics.set_static(rank)


async def startup(rt: Runtime) -> None:
    """The simulated model load, in SGLang's order and log lines; raises StartupFailure where
    SGLang would fail."""
    prefix = rank_prefix(int(rt.cfg.server_args["tp_size"]), rt.dp_size)
    load_time = await _load_weights(rt, prefix)
    reserve = _allocate_kv_cache(rt, prefix)
    graph_time, hr = await _capture_cuda_graphs(rt, prefix, reserve)
    await _allocate_host_pool(rt, prefix)
    rt.log.line(_capacity_line(rt.cfg, hr), prefix)
    rt.build_engines()
    _record_startup(rt, load_time, graph_time, hr)


async def warmup(rt: Runtime, url: str, api_key: str | None) -> None:
    """SGLang's `_wait_and_warmup`: one real request through our own HTTP server."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    rt.status = "warming"
    async with httpx.AsyncClient(timeout=None, headers=headers) as client:
        if not rt.cfg.server_args["skip_server_warmup"]:
            for _ in range(600):
                try:
                    await client.get(
                        url + ("/model_info" if rt.cfg.version.new_endpoints else "/get_model_info")
                    )
                    break
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
            await client.post(
                url + "/generate",
                json={
                    "text": WARMUP_TEXT,
                    "sampling_params": {"temperature": 0, "max_new_tokens": 8},
                },
            )
    rt.status = "up"
    rt.log.line("The server is fired up and ready to roll!")


async def serve(cfg: TwinConfig) -> int:
    clock = SimClock(cfg.time_scale)
    log = SimLog(datetime.now(), clock.now)
    rt = Runtime(cfg, log, clock)
    sa = cfg.server_args
    prefix = rank_prefix(int(sa["tp_size"]), rt.dp_size)
    log.line(_server_args_line(cfg))
    if cfg.unknown_args:
        log.line(f"twin: accepted SGLang flags it does not model: {sorted(cfg.unknown_args)}")
    try:
        await startup(rt)
    except StartupFailure as exc:
        die(log, exc.exc_type, exc.message, prefix, f"scheduler.init_{exc.stage}()")
        return 1  # pragma: no cover - die() does not return

    def on_fatal(exc: BaseException) -> None:
        if isinstance(exc, HostOutOfMemory):
            killed_by_host_oom(log)
        elif isinstance(exc, GpuOutOfMemory):
            die(log, "torch.OutOfMemoryError", str(exc), prefix, "self.run_batch(batch)")
        else:
            die(log, type(exc).__name__, str(exc), prefix, "self.event_loop_normal()")

    rt.on_fatal = on_fatal
    _configure_uvicorn_logging(log)
    config = uvicorn.Config(
        TwinApp(rt).build(),
        host=str(sa["host"]),
        port=int(sa["port"]),
        log_config=None,
        access_log=True,
        timeout_keep_alive=5,
        lifespan="off",
    )
    server = uvicorn.Server(config)
    drive = asyncio.create_task(rt.drive())
    wedge_on_sigusr1(rt, drive, log.line)
    host = "127.0.0.1" if sa["host"] in ("0.0.0.0", "::") else str(sa["host"])
    url = f"http://{host}:{sa['port']}"

    async def after_start() -> None:
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.01)
        await warmup(rt, url, sa["api_key"])
        if cfg.workload and cfg.concurrency:
            log.line(
                f"twin: built-in workload {cfg.workload!r} with {cfg.concurrency} "
                "requests in flight"
            )
            rt.start_workload(cfg.workload, cfg.concurrency)

    starter = asyncio.create_task(after_start())
    try:
        await server.serve()
    finally:
        drive.cancel()
        starter.cancel()
    if not server.started:
        log.line(f"ERROR: could not bind {sa['host']}:{sa['port']}; is the port in use?")
        return 1
    return 0


def split_engine(args: list[str]) -> tuple[str, list[str]]:
    """`--engine sglang|vllm` (default sglang) picks the dialect; the other flags are its own."""
    rest: list[str] = []
    engine = "sglang"
    it = iter(args)
    for arg in it:
        if arg == "--engine":
            engine = next(it, "")
        elif arg.startswith("--engine="):
            engine = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return engine, rest


def main(argv: list[str] | None = None) -> int:
    engine, args = split_engine(list(sys.argv[1:] if argv is None else argv))
    if engine == "vllm":
        return vllm_launch.main(args)
    if engine != "sglang":
        sys.stderr.write(f"--engine: choose sglang or vllm, not {engine!r}\n")
        return 2
    cfg = resolve(args, prog="python -m sim.launch_server")
    try:
        return asyncio.run(serve(cfg))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
