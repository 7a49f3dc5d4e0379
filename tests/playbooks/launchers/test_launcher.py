"""Launcher pieces that need no server: argument edits and reading why a server died."""

from __future__ import annotations

import signal

import pytest

from playbooks.engines.base import ArgError
from playbooks.engines.sglang.allow_list import arg_value, with_change
from playbooks.engines.sglang.signatures import classify_exit


def test_with_change_replaces_adds_and_removes() -> None:
    args = [
        "--model-path",
        "m",
        "--mem-fraction-static",
        "0.85",
        "--enable-metrics",
        "--hicache-size=48",
        "--enable-hierarchical-cache",
    ]
    out = with_change(
        args,
        {
            "mem_fraction_static": 0.88,
            "kv_cache_dtype": "fp8_e4m3",
            "hicache_size": 16,
            "enable_hierarchical_cache": False,
        },
    )
    assert arg_value(out, "mem_fraction_static") == "0.88"
    assert arg_value(out, "kv_cache_dtype") == "fp8_e4m3"
    assert arg_value(out, "hicache_size") == "16"
    assert "--enable-hierarchical-cache" not in out and "--enable-metrics" in out
    assert out.count("--mem-fraction-static") == 1
    with pytest.raises(ArgError, match="not a server argument kvpilot can change; known: "):
        with_change(args, {"model_path": "other"})


def test_exit_reasons_from_sglang_log_lines() -> None:
    assert "too low" in classify_exit(
        -9, "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
    )
    assert "GPU out of memory" in classify_exit(-9, "torch.OutOfMemoryError: CUDA out of memory.")
    assert "host RAM" in classify_exit(-9, "ValueError: Not enough host memory available.")
    assert "OOM killer" in classify_exit(-signal.SIGKILL, "INFO: Uvicorn running")
    assert classify_exit(1, "bye") == "exited with status 1"
