"""kvpilot's start-up check for vLLM on a shared GPU, judged by vLLM's own `request_memory`.

Each case of `tests/playbooks/engines/vllm/test_shared_gpu.py` is a host's GPUs as NVML shows
them and the GPUs the server really runs on. When the server restarts, each of its GPUs has
everything free but what other processes hold (`used - utilization * total` now, the old
process's CUDA context standing in for the new one's). vLLM's own check is asked whether it
starts there; kvpilot must never call a start that vLLM refuses safe, and must call it unsafe
only where vLLM refuses on every placement it could have."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.playbooks.engines.vllm.test_shared_gpu import CASES, GIB, TOTAL, gpu, judged

from .harness import MARKS, vllm_python

pytestmark = MARKS

JUDGE = Path(__file__).resolve().parent / "start_judge.py"
# the GPUs each case's server really runs on (the last case could be on either pair)
RUNS_ON: dict[str, list[tuple[int, ...]]] = {
    "alone: what is free now is its to take": [(0,)],
    "another process holds 10 GiB: 0.90 cannot start": [(0,)],
    "another process holds 10 GiB: 0.85 still starts": [(0,)],
    "another process holds 1.5 GiB": [(0,)],
    "an idle GPU beside it is not its GPU": [(0,)],
    "TP2: the fuller of its two GPUs binds": [(0, 1)],
    "TP2 on three candidate GPUs, one shared": [(0, 1), (0, 2), (1, 2)],
}


def start_cases() -> list[dict[str, Any]]:
    out = []
    for name, used, args, target, _ in CASES:
        u_now = float(args["gpu_memory_utilization"])
        for i, used_gib in enumerate(used):
            others = max(0, int(used_gib * GIB - u_now * TOTAL))
            out.append(
                {"name": f"{name}#{i}", "total_bytes": TOTAL, "free_bytes": TOTAL - others,
                 "utilization": target}
            )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def vllm_says() -> dict[str, dict[str, Any]]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [str(vllm_python()), str(JUDGE)], input=json.dumps({"cases": start_cases()}),
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {r["name"]: r for r in json.loads(proc.stdout)["results"]}


@pytest.mark.parametrize(("name", "used", "args", "target", "_"), CASES, ids=[c[0] for c in CASES])
def test_kvpilot_calls_unsafe_only_what_vllm_refuses_and_warns_of_the_rest(
    name: str,
    used: list[float],
    args: dict[str, Any],
    target: float,
    _: str,
    vllm_says: dict[str, dict[str, Any]],
) -> None:
    placements = RUNS_ON[name]
    refused = [any(not vllm_says[f"{name}#{i}"]["starts"] for i in p) for p in placements]
    option = judged(target, [gpu(i, u) for i, u in enumerate(used)], **args)
    warned = "on startup" in " ".join([*option.reasons, option.risk])
    if all(refused):
        assert option.verdict == "unsafe", (option.verdict, option.reasons)
        error = next(r["error"] for r in vllm_says.values() if r["name"].startswith(name + "#")
                     and not r["starts"])  # fmt: skip
        assert "less than desired GPU memory utilization" in error
    elif any(refused):
        assert option.verdict == "possible" and warned, (option.verdict, option.reasons)
    else:
        assert option.verdict != "unsafe" and not warned, option.reasons
