"""Diagnose against the real SGLang server (CPU, simulated GPU) of the conformance tier."""

from __future__ import annotations

import asyncio
import io
import json
import threading

import httpx
import pytest

from bot.cli import main
from sim.load import run_load
from tests.ports import free_port
from tests.real_sglang.harness import RealSGLang, sglang_env_available

pytestmark = [
    pytest.mark.real_sglang,
    pytest.mark.skipif(
        not sglang_env_available(),
        reason="real SGLang environment not installed (tests/real_sglang/setup.sh)",
    ),
]
ENV = {"KVPILOT_SIM_TIME_SCALE": "4"}


def test_diagnose_and_capacity_prediction_checked_by_restart() -> None:
    with RealSGLang.start(
        free_port(), ["--enable-metrics", "--mem-fraction-static", "0.80"], ENV
    ) as srv:
        load = threading.Thread(
            target=lambda: asyncio.run(
                run_load(srv.url, concurrency=32, profile="short-chat", duration=30)
            )
        )
        load.start()
        out, err = io.StringIO(), io.StringIO()
        code = main(
            [
                "diagnose",
                "--server",
                srv.url,
                "--window",
                "20",
                "--json",
                "--consider",
                "mem_fraction_static=0.85",
                "--consider",
                "kv_cache_dtype=fp8_e4m3",
            ],
            out=out,
            err=err,
        )
        load.join()
        assert code == 0, err.getvalue()
        data = json.loads(out.getvalue())
    assert data["version"] == "0.5.23"
    assert data["capacity"]["gpu_memory_source"].startswith("server: (startup_available")
    assert data["capacity"]["gpu_memory_gib"] == pytest.approx(141, abs=0.05)
    assert data["throughput"]["measured_from"] == "metrics"
    assert data["throughput"]["generation_tokens_per_s"] > 0
    # short chats on a 790K-token pool: nothing waits, the clients are the limit
    assert data["bottleneck"] == "client"
    asked = {o["title"]: o for o in data["options"] if o["considered"]}
    predicted = asked["mem_fraction_static=0.85"]["predicted_max_total_num_tokens"]
    fp8 = asked["kv_cache_dtype=fp8_e4m3"]
    assert fp8["verdict"] == "needs_opt_in"
    assert fp8["predicted_max_total_num_tokens"] == pytest.approx(
        2 * data["capacity"]["max_total_num_tokens"], rel=0.001
    )
    with RealSGLang.start(free_port(), ["--mem-fraction-static", "0.85"], ENV) as srv:
        actual = httpx.get(srv.url + "/server_info").json()["max_total_num_tokens"]
    assert abs(predicted - actual) / actual < 0.02, (predicted, actual)
