"""kvpilot's check of `--kv-offloading-size` judged by the real vLLM's own configuration: the
pinned host memory of a server of several data-parallel engines.

vLLM gives every engine the whole size and divides it over that engine's TP x PP ranks only
(`offload_judge.py`), so a server of N engines pins N times the size on its host. kvpilot must
count it so: with DP=4 on a 200 GiB host, 80 GiB would pin 320 GiB and the kernel would kill
the server (the incident's `--hicache-size 48` x 8 ranks, in vLLM's clothes)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.playbooks.engines.vllm.test_rules import gpu_rules

from .harness import MARKS, vllm_python

pytestmark = MARKS

JUDGE = Path(__file__).resolve().parent / "offload_judge.py"
GIB = 1 << 30
HOST_GIB = 200
SHAPES: list[dict[str, Any]] = [
    {"name": "one engine", "size_gib": 80, "dp": 1, "tp": 1},
    {"name": "DP=4", "size_gib": 80, "dp": 4, "tp": 1},
    {"name": "DP=4 x TP=2", "size_gib": 40, "dp": 4, "tp": 2},
    {"name": "DP=2 x TP=4", "size_gib": 80, "dp": 2, "tp": 4},
]


@pytest.fixture(scope="module")
def vllm_says() -> dict[str, dict[str, Any]]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [str(vllm_python()), str(JUDGE)], input=json.dumps({"shapes": SHAPES}),
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {r["name"]: r for r in json.loads(proc.stdout)["results"]}


@pytest.mark.parametrize("shape", SHAPES, ids=[str(s["name"]) for s in SHAPES])
def test_kvpilot_counts_what_every_engine_pins(
    shape: dict[str, Any], vllm_says: dict[str, dict[str, Any]]
) -> None:
    got = vllm_says[shape["name"]]
    # vLLM: each engine's connector gets the whole size; its ranks split only TP x PP
    assert got["connector"] == "OffloadingConnector"
    assert got["cpu_bytes_per_engine"] == shape["size_gib"] * GIB
    assert got["world_size"] == shape["tp"] and got["engines"] == shape["dp"]
    pinned_gib = got["cpu_bytes_per_engine"] * got["engines"] / GIB
    # kvpilot, told the server's engines as /metrics shows them
    rules = gpu_rules(host_gib=HOST_GIB, engines=shape["dp"], tensor_parallel_size=shape["tp"])
    option = rules.judge({"kv_offloading_size": float(shape["size_gib"])})
    fits = pinned_gib <= HOST_GIB * 0.9
    assert (option.verdict != "unsafe") == fits, (pinned_gib, option.reasons)
    if shape["dp"] > 1:
        assert f"{pinned_gib:g} GiB" in " ".join(option.reasons), option.reasons
