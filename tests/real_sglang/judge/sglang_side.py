"""Judge side: what real SGLang 0.5.23 itself configures for each deployment shape.

Runs under ``$KVPILOT_SGLANG_VENV/bin/python``::

    python sglang_side.py IN.json OUT.json

``IN.json`` is ``{"cases": [case, ...]}``, a case being ``Shape`` of ``__init__.py`` as a dict
plus ``model_dir``. ``OUT.json`` is ``{"results": [...], "timing": {...}}``, one result per
case in the shape described in ``__init__.py``.

Per case, in a forked child (so no case sees globals another's resolution left):

1. the command line goes through ``sglang serve``'s parser, ``ServerArgs.from_cli_args``,
   ``resolve_once()`` and ``check_server_args()`` on a simulated CUDA GPU of ``gpu_mib``
   (``sglang_machine``); ``reserved_mem`` of
   ``arg_groups/memory_hook.py::handle_gpu_memory_settings`` is noted when SGLang derived
   the fraction;
2. the args are published as a scheduler's (``runtime_context.publish``) and the KV pool is
   sized by SGLang's configurator with free memory ``pre_gib`` before and
   ``pre_gib - weights_gib`` after the weights (``sglang_pools``);
3. with ``--enable-hierarchical-cache``, the host pool of one rank is sized and checked.

Any exception is the case's result: ``accepted: false`` with the stage it was raised in.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import os
import sys
import time
import types
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "shim"))
sys.path.insert(0, str(HERE))

from kvpilot_simshim import stubs  # type: ignore[import-not-found]  # noqa: E402

stubs.install("sgl_kernel,torchvision")  # CUDA-linked packages this CPU box cannot import

import sglang_machine  # type: ignore[import-not-found]  # noqa: E402
import sglang_pools  # type: ignore[import-not-found]  # noqa: E402
from sglang.srt.arg_groups import memory_hook  # type: ignore[import-not-found]  # noqa: E402
from sglang.srt.configs.model_config import ModelConfig  # type: ignore[import-not-found]  # noqa: E402
from sglang.srt.runtime_context import (  # type: ignore[import-not-found]  # noqa: E402
    SpawnRanks,
    get_parallel,
    override_platform,
    publish,
)
from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found]  # noqa: E402

GIB = 1 << 30
MACHINE = sglang_machine.MACHINE
# An H200: CUDA, compute capability 9.0 (what get_platform() readers ask).
H200_PLATFORM = {"is_cuda": True, "is_hip": False, "is_sm90": True, "device_capability": (9, 0)}
RESOLVED_KEYS = (
    "mem_fraction_static", "chunked_prefill_size", "max_prefill_tokens", "max_running_requests",
    "max_total_tokens", "attn_dp_size", "tp_size", "dp_size", "pp_size", "ep_size", "nnodes",
    "enable_dp_attention", "kv_cache_dtype", "page_size", "context_length",
    "speculative_algorithm", "speculative_num_draft_tokens", "speculative_num_steps",
    "speculative_eagle_topk", "attention_backend", "enable_hierarchical_cache", "hicache_ratio",
    "hicache_size", "hicache_host_memory_fraction", "hicache_mem_layout", "disable_radix_cache",
    "schedule_conservativeness", "schedule_policy", "quantization", "model_path",
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sglang serve")  # as prepare_server_args builds it
    ServerArgs.add_cli_args(parser)
    return parser


def set_machine(case: dict[str, Any]) -> None:
    MACHINE.gpu_mib = float(case["gpu_mib"])
    MACHINE.free_gib = float(case["pre_gib"])
    host = case.get("host_available_gib")
    MACHINE.host_available_bytes = int((2048 if host is None else host) * GIB)
    limit = case.get("host_cgroup_limit_gib")
    MACHINE.cgroup_headroom_bytes = None if limit is None else int(limit * GIB)
    MACHINE.ranks_per_host = int(case.get("ranks_per_host", 1))


RESERVED: dict[str, float | None] = {"mib": None}
_deepep_reserve = memory_hook.reserve_for_deepep_a2a_mb


def _reserve_for_deepep_a2a_mb(server_args: Any) -> float:
    """memory_hook.reserve_for_deepep_a2a_mb, also noting ``reserved_mem`` of its caller.

    ``handle_gpu_memory_settings`` ends its reserve with
    ``reserved_mem += reserve_for_deepep_a2a_mb(server_args)`` (only the XPU term follows, and
    the device is CUDA), so the caller's local plus this return value is SGLang's reserve.
    """
    extra = float(_deepep_reserve(server_args))
    caller = sys._getframe(1)
    if "reserved_mem" in caller.f_locals:
        RESERVED["mib"] = float(caller.f_locals["reserved_mem"]) + extra
    return extra


memory_hook.reserve_for_deepep_a2a_mb = _reserve_for_deepep_a2a_mb


def resolve(parser: argparse.ArgumentParser, case: dict[str, Any], out: dict[str, Any]) -> Any:
    """ServerArgs as ``sglang serve`` resolves and checks them; sets ``out["stage"]``."""
    argv = ["--model-path", case["model_dir"], "--device", "cuda", "--skip-tokenizer-init"]
    argv += ["--nnodes", str(case.get("nnodes", 1))] if case.get("nnodes", 1) > 1 else []
    argv += list(case["args"])
    out["stage"] = "parse"
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):  # argparse prints usage and the error, exits 2
            namespace = parser.parse_args(argv)
    except SystemExit as exc:
        lines = err.getvalue().strip().splitlines()
        raise ValueError(lines[-1] if lines else f"argparse exit {exc}") from None
    out["stage"] = "construct"
    server_args = ServerArgs.from_cli_args(namespace)
    out["stage"] = "resolve"
    RESERVED["mib"] = None
    server_args.resolve_once()
    out["reserved_mib"] = RESERVED["mib"]
    out["stage"] = "check"
    server_args.check_server_args()
    return server_args


def publish_scheduler(server_args: Any) -> None:
    """The process config of DP rank 0's first scheduler (``runtime_context.publish``)."""
    dp_rank = 0 if server_args.dp_size > 1 else None
    publish(
        server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=dp_rank, gpu_id=0)
    )
    # FAKE: the WORLD process group. _profile_available_bytes only hands its cpu_group to
    # get_available_gpu_memory, which the simulated machine answers (already the minimum).
    get_parallel().override_permanently(
        world_group=types.SimpleNamespace(cpu_group=None, world_size=1)
    )


def resolved_fields(server_args: Any) -> dict[str, Any]:
    full = server_args.resolved_dict()
    out = {key: full.get(key) for key in RESOLVED_KEYS}
    graph = full.get("cuda_graph_config") or {}
    out["cuda_graph_max_bs_decode"] = (graph.get("decode") or {}).get("max_bs")
    out["cuda_graph_backend_prefill"] = str((graph.get("prefill") or {}).get("backend"))
    return out


def server_info(server_args: Any, case: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """What ``GET /server_info`` of 0.5.23 reports for this shape (utils/common.py::
    build_server_info, scheduler_components/internal_state.py), one internal state per DP
    rank; memory_usage in GB (2**30 bytes) as the scheduler logs it."""
    info: dict[str, Any] = json.loads(json.dumps(server_args.resolved_dict(), default=str))
    tokens = result["max_total_num_tokens"]
    attn_dp_size = int(result["resolved"]["attn_dp_size"] or 1)
    kv_bytes = (result["cell_size_bytes"] or 0) * (result["full_max_total_num_tokens"] or tokens)
    if result["swa_max_total_num_tokens"] and result.get("swa_cell_size_bytes"):
        kv_bytes += result["swa_cell_size_bytes"] * result["swa_max_total_num_tokens"]
    state = {
        "memory_usage": {
            "weight": round(case["weights_gib"], 2),
            "kvcache": round(kv_bytes / GIB, 2),
            # Free memory once the weights and the KV pool are resident.
            "startup_available": round(case["pre_gib"] - case["weights_gib"] - kv_bytes / GIB, 2),
            "token_capacity": tokens,
            "token_capacity_swa": result["swa_max_total_num_tokens"] or 0,
            "graph": {},
        },
        "effective_max_running_requests_per_dp": result["max_running_requests_per_dp"],
        "world_size": server_args.tp_size * server_args.pp_size,
    }
    info.update(
        max_total_num_tokens=tokens,
        max_req_input_len=min(result["resolved"]["context_length_effective"] - 1, tokens - 1) - 5,
        # One scheduler per DP rank (attention DP ranks under --enable-dp-attention).
        internal_states=[dict(state) for _ in range(max(server_args.dp_size, attn_dp_size))],
        version="0.5.23",
    )
    return info


def judge_case(parser: argparse.ArgumentParser, case: dict[str, Any]) -> dict[str, Any]:
    """One case, start to end, in this process."""
    set_machine(case)
    out: dict[str, Any] = {"name": case["name"], "reserved_mib": None}
    try:
        with override_platform(**H200_PLATFORM):
            server_args = resolve(parser, case, out)
            out["resolved"] = resolved_fields(server_args)
            out["stage"] = "configure"
            publish_scheduler(server_args)
            model_config = ModelConfig.from_server_args(server_args)
            out["resolved"]["context_length_effective"] = model_config.context_len
            MACHINE.free_gib = float(case["pre_gib"]) - float(case["weights_gib"])
            pool = sglang_pools.size_kv_pool(server_args, model_config, float(case["pre_gib"]))
            out["resolved"]["kv_cache_dtype_resolved"] = pool.pop("kv_cache_dtype_str")
            out["resolved"]["kv_cache_torch_dtype"] = pool.pop("kv_cache_dtype_torch")
            configurator = pool["configurator"]
            out["host_pool"] = None
            if server_args.enable_hierarchical_cache:
                out["stage"] = "host_pool"
                out["host_pool"] = sglang_pools.size_host_pool(pool)
            del pool["configurator"], configurator
            out.update(pool)
            out["server_info"] = server_info(server_args, case, out)
    except Exception as exc:
        out.update(
            accepted=False, error=f"{type(exc).__name__}: {exc}", exc_type=type(exc).__name__
        )
        return out
    out.update(accepted=True, stage="done", error=None, exc_type=None)
    return out


def in_child(parser: argparse.ArgumentParser, case: dict[str, Any]) -> dict[str, Any]:
    """``judge_case`` in a forked child; the result comes back as JSON through a pipe."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            result = judge_case(parser, case)
        except BaseException as exc:
            result = {"name": case["name"], "accepted": False, "stage": "crash", "error": repr(exc)}
        with os.fdopen(write_fd, "w") as pipe:
            json.dump(result, pipe, default=repr)
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        text = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not text:
        return {
            "name": case["name"],
            "accepted": False,
            "stage": "crash",
            "error": f"wait {status}",
        }
    parsed: dict[str, Any] = json.loads(text)
    return parsed


def main(in_path: str, out_path: str) -> int:
    started = time.perf_counter()
    with open(in_path) as f:
        cases = json.load(f)["cases"]
    sglang_machine.replace_copies()
    sglang_machine.treat_device_as_cuda()
    sglang_machine.patch_host_probes()
    parser = build_parser()
    # The first case of each model imports its model class and most of SGLang (seconds); do
    # that once here, so that every forked child starts with the modules loaded.
    for model_dir in dict.fromkeys(case["model_dir"] for case in cases):
        first = next(case for case in cases if case["model_dir"] == model_dir)
        judge_case(parser, {**first, "name": "warmup"})
    # Objects alive now are never collected in a child: SGLang's gc.collect() in
    # _profile_available_bytes then scans only what the case made, and copy-on-write pages stay
    # shared (without this a case costs about a second).
    gc.freeze()
    warmed = time.perf_counter()
    results = []
    for case in cases:
        tic = time.perf_counter()
        result = in_child(parser, case)
        result["ms"] = round((time.perf_counter() - tic) * 1000, 2)
        results.append(result)
    done = time.perf_counter()
    timing = {
        "startup_s": round(warmed - started, 3),
        "cases": len(cases),
        "ms_per_case": round((done - warmed) * 1000 / max(1, len(cases)), 2),
    }
    with open(out_path, "w") as f:
        json.dump({"results": results, "timing": timing}, f, default=repr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2]))
