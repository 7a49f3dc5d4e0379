"""The documents of the twin's state endpoints (/server_info, /model_info, /v1/loads, /get_load).

Pure functions of the runtime, apart from the HTTP layer in `sim.server`, so that each SGLang
dialect's shape of a document can be read in one place.
"""

from __future__ import annotations

import time
from typing import Any

from sim.engine import Engine
from sim.metric_families import GRAPH_PHASES
from sim.runtime import Runtime

# The server arguments each rank repeats in its `internal_states` entry.
_RANK_ARGS = (
    "mem_fraction_static",
    "max_total_tokens",
    "max_running_requests",
    "chunked_prefill_size",
    "max_prefill_tokens",
    "page_size",
    "kv_cache_dtype",
)


def _memory_usage(rt: Runtime) -> dict[str, Any]:
    cap = rt.cfg.capacity
    mem = rt.cfg.preset.memory
    usage: dict[str, Any] = {
        "weight": round(mem.weights_gib, 2),
        "kvcache": round(cap.kv_cache_gib, 2),
        "token_capacity": cap.max_total_num_tokens,
        "graph": round(mem.graph_gib, 2),
    }
    if rt.cfg.version.at_least("0.5.17"):
        # SGLang reads free GPU memory once start-up is done (the `available_gpu_mem`
        # of its summary line): what is left after the KV pool and the CUDA graphs; and
        # reports the graphs per phase (both as the real 0.5.17 did on an H100 and an H200).
        usage["startup_available"] = round(rt.startup_available_gib, 3)
        usage["token_capacity_swa"] = cap.swa_tokens
        usage["kvcache"] = round(cap.kv_cache_gib, 3)
        prefill = 0.0 if rt.prefill_graph_skipped else mem.prefill_graph_gib
        by_phase = {"prefill": prefill, "decode": mem.graph_gib - mem.prefill_graph_gib}
        usage["graph"] = {phase: round(by_phase.get(phase, 0.0), 3) for phase in GRAPH_PHASES}
    return usage


def _rank_state(rt: Runtime, args: dict[str, Any], rank: int, engine: Engine) -> dict[str, Any]:
    state: dict[str, Any] = {
        **{k: args[k] for k in _RANK_ARGS},
        "dp_rank": rank,
        "last_gen_throughput": engine.last_gen_throughput,
        "memory_usage": _memory_usage(rt),
    }
    if rt.cfg.version.refactored:
        state["world_size"] = args["tp_size"] * args["pp_size"]
        state["startup_time"] = rt.startup_time
        state["effective_max_running_requests_per_dp"] = rt.cfg.max_running_requests
    return state


def server_info(rt: Runtime) -> dict[str, Any]:
    """/server_info (or /get_server_info): the arguments, scheduler limits and every rank."""
    cfg = rt.cfg
    version = cfg.version
    args = dict(cfg.server_args)
    args.update(cfg.unknown_args)
    scheduler_info: dict[str, Any] = {
        "max_total_num_tokens": cfg.capacity.max_total_num_tokens,
        "max_req_input_len": cfg.max_req_input_len,
    }
    if not version.new_endpoints:
        scheduler_info["status"] = "ready"
    out: dict[str, Any] = {**args, **scheduler_info}
    if version.refactored:
        out["launch_command"] = redacted_command(cfg.launch_command)
        out["startup_time"] = rt.startup_phases
        out["frontend"] = "python"
    out["internal_states"] = [
        _rank_state(rt, args, rank, engine) for rank, engine in enumerate(rt.engines)
    ]
    out["version"] = str(version)
    out["kvpilot_twin"] = {
        "preset": cfg.preset.name,
        "time_scale": rt.clock.scale,
        "sim_time_s": round(rt.sim_now, 3),
    }
    return out


def model_info(rt: Runtime) -> dict[str, Any]:
    """/model_info (or /get_model_info)."""
    m = rt.cfg.preset.model
    sa = rt.cfg.server_args
    info: dict[str, Any] = {
        "model_path": sa["model_path"],
        "tokenizer_path": sa["tokenizer_path"],
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": m.multimodal,
        "has_audio_understanding": False,
        "model_type": m.model_type,
        "architectures": [m.architecture],
    }
    if rt.cfg.version.refactored:
        info.update(
            served_model_name=sa["served_model_name"],
            load_format="auto",
            reasoning_parser=None,
            tool_call_parser=None,
            disaggregation_mode="null",
            embedding={"family": "none", "task": "none", "enabled": False},
        )
    return info


def get_load(rt: Runtime) -> list[dict[str, Any]]:
    """/get_load, the endpoint the refactored dialect replaced with /v1/loads."""
    return [
        {
            "dp_rank": rank,
            "num_reqs": len(e.running) + len(e.waiting),
            "num_waiting_reqs": len(e.waiting),
            "num_tokens": e.used_tokens,
        }
        for rank, e in enumerate(rt.engines)
    ]


def _refactored_load(e: Engine) -> dict[str, Any]:
    """The fields of a /v1/loads entry that only the refactored dialect reports."""
    return {
        "timestamp": time.time(),
        "num_waiting_uncached_tokens": sum(r.seq_len for r in e.waiting),
        "num_total_tokens": e.size - e.free,
        "num_active_tokens": e.used_tokens,
        "num_prealloc_ready_tokens": 0,
        "total_prefill_uncached_tokens": e.prefill_computed_total,
        "total_prefill_busy_us": int(e.prefill_time * 1e6),
        # [steps, sum batch, sum step us, sum batch^2, sum batch*us, sum generated]
        "decode_moments": list(e.decode_moments) if e.decode_moments[0] > 0 else None,
        "disaggregation": {
            "mode": "null",
            "prefill_bootstrap_queue_reqs": 0,
            "prefill_inflight_queue_reqs": 0,
            "decode_prealloc_queue_reqs": 0,
            "decode_transfer_queue_reqs": 0,
            "decode_retracted_queue_reqs": 0,
            "kv_transfer_speed_gb_s": 0.0,
            "kv_transfer_latency_ms": 0.0,
        },
    }


def rank_load(rt: Runtime, rank: int, include: set[str]) -> dict[str, Any]:
    """One rank's /v1/loads entry; `include` names the optional blocks asked for."""
    e = rt.engines[rank]
    load: dict[str, Any] = {
        "dp_rank": rank,
        "num_running_reqs": len(e.running),
        "num_waiting_reqs": len(e.waiting),
        "num_used_tokens": e.used_tokens,
        "max_total_num_tokens": e.size,
        "max_running_requests": e.cfg.max_running_requests,
        "token_usage": round(e.token_usage, 4),
        "gen_throughput": round(e.last_gen_throughput, 2),
        "cache_hit_rate": round(e.last_cache_hit_rate, 4),
        "utilization": round(len(e.running) / max(1, e.cfg.max_running_requests), 4),
    }
    if rt.cfg.version.refactored:
        load.update(_refactored_load(e))
        include = include | {"memory", "queues"}
    else:
        load["num_total_reqs"] = len(e.running) + len(e.waiting)
    if "memory" in include or "all" in include:
        mem = rt.cfg.preset.memory
        load["memory"] = {
            "weight_gb": round(mem.weights_gib, 2),
            "kv_cache_gb": round(rt.cfg.capacity.kv_cache_gib, 2),
            "graph_gb": round(mem.graph_gib, 2),
            "token_capacity": e.size,
        }
    if "queues" in include or "all" in include:
        load["queues"] = {
            "waiting": len(e.waiting),
            "grammar": 0,
            "paused": 0,
            "retracted": sum(1 for r in e.waiting if r.retractions),
            "prealloc_ready": 0,
        }
    return load


def loads_prometheus(loads: list[dict[str, Any]]) -> str:
    """/v1/loads?format=prometheus: every numeric field as a gauge labelled by rank."""
    lines = []
    for load in loads:
        for key, value in load.items():
            if isinstance(value, (int, float)) and key != "dp_rank":
                lines.append(f'sglang_{key}{{dp_rank="{load["dp_rank"]}"}} {value}')
    return "\n".join(lines) + "\n"


def loads_body(rt: Runtime, loads: list[dict[str, Any]]) -> dict[str, Any]:
    """/v1/loads as JSON: the refactored dialect lists ranks, the older one adds an aggregate."""
    version = rt.cfg.version
    body: dict[str, Any] = {"timestamp": time.time(), "version": str(version)}
    if version.refactored:
        body.update(accelerator="cuda", num_accelerators=rt.cfg.ranks_on_host, loads=loads)
        return body
    n = max(1, len(loads))
    body.update(
        dp_rank_count=len(rt.engines),
        loads=loads,
        aggregate={
            "total_running_reqs": sum(x["num_running_reqs"] for x in loads),
            "total_waiting_reqs": sum(x["num_waiting_reqs"] for x in loads),
            "total_reqs": sum(x["num_running_reqs"] + x["num_waiting_reqs"] for x in loads),
            "avg_token_usage": sum(x["token_usage"] for x in loads) / n,
            "avg_throughput": sum(x["gen_throughput"] for x in loads) / n,
            "avg_utilization": sum(x["utilization"] for x in loads) / n,
        },
    )
    return body


def redacted_command(argv: list[str]) -> str:
    """The launch command as SGLang reports it, with the API keys' values hidden."""
    out: list[str] = ["python3", "-m", "sglang.launch_server"]
    hide = False
    for tok in argv:
        if hide:
            out.append("<redacted>")
            hide = False
            continue
        if tok in ("--api-key", "--admin-api-key"):
            hide = True
        out.append(tok)
    return " ".join(out)
