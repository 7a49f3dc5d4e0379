"""Judge side: what each data-parallel engine of the real vLLM pins for `--kv-offloading-size`.

Runs under the vLLM venv (``tests/real_vllm/setup.sh``)::

    .venv-vllm/bin/python tests/real_vllm/offload_judge.py < shapes.json > results.json

Input: ``{"shapes": [{"name", "size_gib", "dp", "tp"}, ...]}``. For each, vLLM's own
``VllmConfig`` is built with that cache and parallel configuration; its post-init turns the
size into the offloading connector's ``cpu_bytes_to_use`` (config/vllm.py), which every engine
of the server receives whole, and the CPU offload spec divides it over
``parallel_config.world_size`` (v1/kv_offload/cpu/spec.py), which counts TP x PP, not DP.
Output: ``{"results": [{"name", "cpu_bytes_per_engine", "world_size", "engines",
"connector"}]}``. Runs on the CPU: only configuration objects are built.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # stdout carries the JSON only

from vllm.config import CacheConfig, ParallelConfig, VllmConfig


def judged(shape: dict[str, Any]) -> dict[str, Any]:
    size = float(shape["size_gib"])
    cache = CacheConfig(kv_offloading_size=size, kv_offloading_backend="native")
    parallel = ParallelConfig(
        data_parallel_size=int(shape["dp"]), tensor_parallel_size=int(shape["tp"])
    )
    config = VllmConfig(cache_config=cache, parallel_config=parallel)
    transfer = config.kv_transfer_config
    assert transfer is not None, "vLLM configured no connector for kv_offloading_size"
    return {
        "name": shape["name"],
        "cpu_bytes_per_engine": int(transfer.kv_connector_extra_config["cpu_bytes_to_use"]),
        "world_size": config.parallel_config.world_size,
        "engines": config.parallel_config.data_parallel_size,
        "connector": transfer.kv_connector,
    }


def main() -> None:
    shapes = json.load(sys.stdin)["shapes"]
    json.dump({"results": [judged(s) for s in shapes]}, sys.stdout)


if __name__ == "__main__":
    main()
