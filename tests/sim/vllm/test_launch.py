"""Choosing the dialect on `python -m sim.launch_server`."""

from __future__ import annotations

from sim.launch_server import main, split_engine


def test_engine_flag_is_taken_out_of_the_dialects_flags() -> None:
    assert split_engine(["--port", "1", "--engine", "vllm", "serve", "m"]) == (
        "vllm",
        ["--port", "1", "serve", "m"],
    )
    assert split_engine(["--engine=vllm"]) == ("vllm", [])
    assert split_engine(["--mem-fraction-static", "0.8"]) == (
        "sglang",
        ["--mem-fraction-static", "0.8"],
    )


def test_unknown_engine_is_refused() -> None:
    assert main(["--engine", "trt"]) == 2
