"""The call on the GPU machine once the first checks passed: the GPU and libnvrtc found, the
bundle unpacked, the environment set, then the planned phases, each one's file written to the
results folder as soon as it ends (a call cut off at its limit still returns what it did)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.real_gpu import archive
from tests.real_gpu import env as genv
from tests.real_gpu.commands import sglang_command
from tests.real_gpu.plan import Plan, Settings, describe, make_plan
from tests.real_gpu.results import OUT_LIMIT, ab_file, load_dirs, render
from tests.real_gpu.run import Progress

if TYPE_CHECKING:  # imported at run time once the bundle is on the path
    from tests.real_gpu.call import Call


def prepare(
    ns: argparse.Namespace,
    s: Settings,
    out: Path,
    say: Callable[[str], None],
    deadline: float,
    repo: Path,
) -> int:
    """Check the GPU side, unpack, set the environment, then run the phases; the exit status."""
    from playbooks.sources.gpu import GpuUnavailable, NvmlGpuReader  # noqa: PLC0415

    gpus = NvmlGpuReader()
    try:
        states: list[Any] | None = gpus.snapshot()
        error = None
    except GpuUnavailable as exc:
        states, error = None, str(exc)
    nvrtc = genv.find_library(genv.NVRTC, genv.site_roots())
    checks = [genv.check_gpus(states, error), genv.check_library(genv.NVRTC, nvrtc)]
    for c in checks:
        say(c.line())
    if any(not c.ok for c in checks):
        say("stopping: fix the errors above (nothing was started)")
        return 3
    began = time.monotonic()
    bundle_dir, reused = genv.unpack(ns.bundle, ns.work)
    say(
        f"bundle {'reused' if reused else 'unpacked'} at {bundle_dir} "
        f"({time.monotonic() - began:.0f} s)"
    )
    cache = ns.work / "cache"
    cache_state = genv.restore_cache(ns.bundle.parent / genv.CACHE_NAME, cache)
    nvcc = genv.find_nvcc(os.environ.get("PATH", ""))
    nvcc_check = genv.check_nvcc(nvcc, cache_state != "empty")
    say(f"compile caches: {cache_state} ({cache}); {nvcc_check.line()}")
    if not nvcc_check.ok and nvcc_check.fatal:
        return 3
    site, model = bundle_dir / "site", bundle_dir / "model"
    common = {"site": site, "cache": cache, "nvrtc_dir": nvrtc, "nvcc": nvcc}
    server_env = genv.runtime_env(os.environ, **common)
    tool_env = genv.runtime_env(os.environ, **common, repo=repo)
    sys.path.insert(0, str(site))  # kvpilot's own dependencies, for what runs in-process
    from tests.real_gpu.call import Call  # noqa: PLC0415 - needs the bundle on the path
    from tests.real_gpu.server import Machine  # noqa: PLC0415

    folder = ns.work / "calls" / time.strftime("%Y%m%d-%H%M%S")
    if isinstance(say, Progress):  # its lines go into the call's logs too
        (folder / "logs").mkdir(parents=True, exist_ok=True)
        say.log = folder / "logs" / "00-runner.log"
    machine = Machine(
        python=sys.executable,
        server=lambda f, extra: sglang_command(sys.executable, model, f, extra),
        server_env=server_env,
        tool_env=tool_env,
        gpus=gpus,
        logs=folder / "logs",
    )
    call = Call(machine=machine, settings=s, work=folder, say=say, deadline=deadline)
    plan = make_plan(s, jit_cached=cache_state != "empty", unpacked=True)
    meta = {
        "gpu": machine.gpu(),
        "checks": [c.line() for c in (*checks, nvcc_check)],
        "bundle": json.loads((bundle_dir / "BUNDLE.json").read_text()),
        "bundle_reused": reused,
        "compile_cache": cache_state,
        "python": sys.version.split()[0],
        "settings": {k: v for k, v in vars(ns).items() if k not in ("bundle", "work", "out")},
    }
    return run_phases(call, plan, out, meta, cache)


def phase_functions() -> dict[str, Callable[[Call], dict[str, Any]]]:
    from tests.real_gpu.ab import ab  # noqa: PLC0415 - imported once the bundle is on the path
    from tests.real_gpu.experiment import experiment, experiment_clear  # noqa: PLC0415
    from tests.real_gpu.oom import oom_probe  # noqa: PLC0415
    from tests.real_gpu.phases import capacity, smoke  # noqa: PLC0415

    return {
        "smoke": smoke,
        "capacity": capacity,
        "experiment-clear": experiment_clear,
        "experiment": experiment,
        "oom-probe": oom_probe,
        "ab": ab,
    }


def run_phases(call: Call, plan: Plan, out: Path, meta: dict[str, Any], cache: Path | None) -> int:
    """Each planned phase that still fits, in order; every file written as it ends."""
    out.mkdir(parents=True, exist_ok=True)
    functions = phase_functions()
    for line in describe(plan, call.settings):
        call.say(line)
    ran: list[dict[str, Any]] = []
    skipped = [list(x) for x in plan.skipped]
    stop_reason = None
    packed: tuple[int, int] | None = None
    for phase, estimate in plan.steps:
        left = call.left_s()
        if stop_reason is not None or estimate > left:
            why = stop_reason or f"needs about {estimate:.0f} s and {left:.0f} s are left"
            call.say(f"== {phase}: skipped, {why}")
            skipped.append([phase, why])
            continue
        call.say(f"== {phase} (about {estimate:.0f} s, {left:.0f} s left)")
        began = time.monotonic()
        try:
            result = functions[phase](call)
        except Exception as exc:  # the phase's failure is its result; the next may still run
            result = {
                "phase": phase,
                "status": "failed",
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-4000:],
            }
            call.say(f"  failed: {type(exc).__name__}: {exc}")
        seconds = round(time.monotonic() - began, 1)
        result["seconds"] = seconds
        result["estimate_s"] = estimate
        name = ab_file(call.settings.ab_side) if phase == "ab" else f"{phase}.json"
        (out / name).write_text(json.dumps(result, indent=1, default=str) + "\n")
        ran.append(
            {
                "phase": phase,
                "status": result["status"],
                "seconds": seconds,
                "estimate_s": estimate,
                "file": name,
            }
        )
        call.say(f"== {phase}: {result['status']} in {seconds:.0f} s (planned {estimate:.0f} s)")
        if phase == "smoke" and result["status"] != "ok":
            stop_reason = "smoke failed"
        packed = write_summary(call, out, meta, ran, skipped, cache, packed)
    if not ran:
        write_summary(call, out, meta, ran, skipped, cache, packed)
    return 0 if ran and all(r["status"] == "ok" for r in ran) else 1


def write_summary(
    call: Call,
    out: Path,
    meta: dict[str, Any],
    ran: list[dict[str, Any]],
    skipped: list[list[str]],
    cache: Path | None,
    packed: tuple[int, int] | None,
) -> tuple[int, int] | None:
    """run.json, results.txt, the logs' archive and (when it changed) the compile caches'."""
    run = {**meta, "ran": ran, "skipped": skipped, "left_s": round(call.left_s(), 1)}
    (out / "run.json").write_text(json.dumps(run, indent=1, default=str) + "\n")
    (out / "results.txt").write_text(render(load_dirs([out])))
    logs = call.machine.logs
    if logs.is_dir():
        archive.write_archive(logs, out / "logs.tar.xz", preset=6)
    if cache is not None and genv.has_files(cache):
        files = [p for p in cache.rglob("*") if p.is_file()]
        signature = (len(files), sum(p.stat().st_size for p in files))
        if signature != packed:
            genv.pack_cache(cache, out / genv.CACHE_NAME)
            packed = signature
    names = sorted(p.name for p in out.iterdir())
    if len(names) > OUT_LIMIT:
        call.say(f"WARNING: {len(names)} files in {out}, only {OUT_LIMIT} come back: {names}")
    return packed
