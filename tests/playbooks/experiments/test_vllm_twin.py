"""The incident on the vLLM twin, end to end through the CLI: diagnosed, a utilization change
kept with the capacity kvpilot predicted, and a change that cannot help reverted.

A Llama-3.1-8B server on an H100 started at `--gpu-memory-utilization 0.35` (say, left low from
when it shared the GPU) and `--max-num-seqs 64`, with 96 clients of long answers: the KV cache
holds ~40 of them, the rest wait, and vLLM preempts. At 0.95 the sequence cap binds instead, so
requests still wait and the gate can judge throughput (it judges only a saturated server), and
the gain kvpilot predicts for 0.95 is the batch's growth to that cap, not to the clients.

The twin serves from a model directory holding the model's config.json, as a real server does,
so kvpilot reads the KV geometry there. It runs at 50x: at the demo's 100x, next to the
parallel tier's other twins on two cores, kvpilot's scrapes (one per 10 s of the twin's clock)
fell behind it often enough that the baseline lacked readings in most of its batches.
"""

from __future__ import annotations

import io
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.cli import main
from sim.models import LLAMA_3_1_8B, write_model_dir
from tests.ports import free_port

SCALE = 50
GPU_TOTAL_GIB = 79.65  # the preset's H100: 81,559 MiB, the base of vLLM's utilization
TOLERANCE = 0.02
SEQ_CAP = 64

pytestmark = pytest.mark.slow


class Workspace:
    def __init__(self, tmp_path: Path) -> None:
        self.port = free_port()
        model = write_model_dir(LLAMA_3_1_8B, tmp_path / "models" / "Llama-3.1-8B-Instruct")
        command = [
            sys.executable, "-m", "sim.vllm", "serve", str(model),
            "--preset", "llama-3.1-8b-h100", "--port", str(self.port),
            "--gpu-memory-utilization", "0.35", "--max-model-len", "32768",
            "--max-num-seqs", str(SEQ_CAP), "--time-scale", str(SCALE),
            "--workload", "incident", "--concurrency", "96", "--seed", "7",
        ]  # fmt: skip
        self.config = tmp_path / "kvpilot.toml"
        self.config.write_text(
            f"[kvpilot]\ntime_scale = {SCALE}\n\n"
            "[gate]\nscrape_s = 10\nbatch_s = 30\nbaseline_s = 300\nmax_trial_s = 600\n\n"
            f'[servers.v]\nurl = "{self.url}"\nengine = "vllm"\n'
            f"gpu_memory_gib = {GPU_TOTAL_GIB}\n"
            '[servers.v.launcher]\nkind = "process"\n'
            f"command = {json.dumps(command)}\n"
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cli(self, *args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = main([*args, "--config", str(self.config)], out=out, err=err)
        return code, out.getvalue(), err.getvalue()

    def cache_config(self) -> dict[str, str]:
        """The twin's own `vllm:cache_config_info` labels (what a real vLLM exports)."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        line = next(x for x in text.splitlines() if x.startswith("vllm:cache_config_info{"))
        return dict(re.findall(r'(\w+)="([^"]*)"', line))

    def experiment(self, change: str) -> tuple[int, dict[str, Any], str]:
        code, out, err = self.cli("experiment", "--server", "v", "--set", change, "--yes", "--json")
        return code, (json.loads(out) if out.strip() else {}), err


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Workspace]:
    w = Workspace(tmp_path)
    code, _, err = w.cli("server", "start", "--server", "v")
    assert code == 0, err
    try:
        yield w
    finally:
        w.cli("server", "stop", "--server", "v")


# Its baseline needs the twin's scrapes on time: in a fresh clone's parallel tier, beside the real
# environments' installs, the baseline at 50x got no complete batch ("0 complete batches of 30 s"),
# so it runs in the serial tier, like the vLLM demo.
@pytest.mark.serial
def test_vllm_incident_is_diagnosed_then_kept_then_a_useless_change_reverted(
    ws: Workspace,
) -> None:
    # by its name, as the console does: the launcher's arguments say what the metrics do not
    # (max_num_seqs)
    code, out, err = ws.cli("diagnose", "--server", "v", "--window", "300", "--json")
    assert code == 0, err
    found = json.loads(out)
    assert found["engine"] == "vLLM"
    assert found["bottleneck"] == "kv_cache", found["evidence"]
    assert found["retractions"] and found["retractions"] > 0  # vLLM preempted
    options = {o["title"]: o for o in found["options"]}
    proposal = options["gpu_memory_utilization=0.95"]
    assert proposal["verdict"] == "recommended", proposal
    predicted = proposal["predicted_max_total_num_tokens"]
    assert predicted > 2 * found["capacity"]["max_total_num_tokens"]
    # The pool would hold more than the 96 clients, but at most 64 run: the gain is bounded by
    # the batch's growth to the cap, and the option says which cap binds.
    running = found["capacity"]["running"]
    gain = proposal["predicted_throughput_change"]
    assert gain["high"] <= SEQ_CAP / running - 1 + 1e-3, (gain, running)
    assert any(f"capped by max_num_seqs={SEQ_CAP}" in r for r in proposal["reasons"]), proposal

    code, result, err = ws.experiment("gpu_memory_utilization=0.95")
    assert code == 0, err
    assert result["state"] == "kept", (result.get("rule"), result.get("reason"))
    # what the gate measured agrees with the prediction (was +73%..+146% against +34%)
    low, high = result["effect"]["ci95"]
    assert low <= gain["high"] and gain["low"] <= high, (gain, result["effect"])
    cache = ws.cache_config()
    assert cache["gpu_memory_utilization"] == "0.95"
    # the twin's "GPU KV cache size: N tokens" figure, against kvpilot's prediction
    actual = int(cache["kv_cache_size_tokens"])
    assert abs(predicted - actual) / actual <= TOLERANCE, (predicted, actual)

    # With the sequence cap binding now, a larger token budget only changes how prompts are
    # chunked: nothing to gain, so the gate must not keep it.
    code, result, err = ws.experiment("max_num_batched_tokens=16384")
    assert code == 3, err
    assert result["state"] == "reverted", result
    assert result["outcome"] == "not_improved"
    cache = ws.cache_config()
    assert cache["gpu_memory_utilization"] == "0.95"  # back on the kept configuration
