"""Judge side: does the real vLLM start with this much free GPU memory at this utilization?

Runs under the vLLM venv (``tests/real_vllm/setup.sh``)::

    .venv-vllm/bin/python tests/real_vllm/start_judge.py < cases.json > results.json

Input: ``{"cases": [{"name", "total_bytes", "free_bytes", "utilization"}, ...]}``. For each,
vLLM's own start-up check, ``request_memory`` (v1/worker/utils.py), is called with a memory
snapshot of that total and free memory (not measured: the CPU build has no GPU) and a
``CacheConfig`` of that utilization. Output: ``{"results": [{"name", "starts", "error"}]}``,
the error being vLLM's own message where it refuses.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # stdout carries the JSON only

from vllm.config import CacheConfig
from vllm.utils.mem_utils import MemorySnapshot
from vllm.v1.worker.utils import request_memory


def judged(case: dict[str, Any]) -> dict[str, Any]:
    snapshot = MemorySnapshot(
        free_memory=int(case["free_bytes"]),
        total_memory=int(case["total_bytes"]),
        device="cpu",
        auto_measure=False,
    )
    cache = CacheConfig(gpu_memory_utilization=float(case["utilization"]))
    try:
        request_memory(snapshot, cache)
    except ValueError as exc:
        return {"name": case["name"], "starts": False, "error": str(exc)}
    return {"name": case["name"], "starts": True, "error": None}


def main() -> int:
    cases = json.load(sys.stdin)["cases"]
    json.dump({"results": [judged(c) for c in cases]}, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
