"""The twin's `llama-3.1-8b-h100` preset held to what the real SGLang 0.5.17 showed on an H100
80GB (Llama-3-8B in bf16, random weights; the first GPU run, 2026-12-05/06): its capacity at
ten fractions, its weights and CUDA graphs, its start-up, and its decode steps under the
incident-like load (150 closed-loop clients, prompts U(400,1000), outputs U(1000,4000)).

A running request of that load holds ~2,100 KV tokens on average (its prompt, 700, plus the
time-weighted half of its output, E[L^2] / 2E[L] = 1,400), so 57 running requests read ~120K
tokens a step and 150 read ~315K; the H200 recording of the same load measured 2,113."""

from __future__ import annotations

import httpx
import pytest

from sim.memory import headroom, plan_capacity
from sim.presets import PRESETS
from sim.version import SGLangVersion
from tests.playbooks.engines.sglang.test_gpu_capacity import REAL  # SGLang's, on the H100
from tests.twin_process import running_twin

H100 = PRESETS["llama-3.1-8b-h100"]
TOKENS_PER_REQUEST = 2_100
# (running requests, decode step seconds) under the load, at 0.40 and at 0.85
REAL_STEPS = [(57, 0.0135), (150, 0.024)]


@pytest.mark.parametrize("fraction", sorted(REAL))
def test_the_pool_is_the_gpus_at_every_fraction(fraction: float) -> None:
    cap = plan_capacity(H100, SGLangVersion.parse("0.5.17"), fraction, "bf16", 1, 1, None)
    assert cap.max_total_num_tokens == pytest.approx(REAL[fraction], rel=2e-4)


def test_weights_graphs_and_start_up_are_the_gpus() -> None:
    assert H100.memory.weights_gib == pytest.approx(15.02)
    assert headroom(H100, 0.40, False).graph_gib == pytest.approx(1.473 + 0.455)
    assert 37 <= H100.startup_s <= 54


@pytest.mark.parametrize(("running", "step_s"), REAL_STEPS)
def test_a_decode_step_takes_what_it_took_on_the_gpu(running: int, step_s: float) -> None:
    st = H100.step
    kv_bytes = running * TOKENS_PER_REQUEST * H100.model.cell_size("bf16", 1)
    modelled = st.decode_base_s + st.per_seq_s * running + kv_bytes / st.mem_bw_bytes_per_s
    assert modelled == pytest.approx(step_s, rel=0.05)


# What SGLang 0.5.17 logged on the H100 (the OOM probe, tests/fixtures/gpu/h100-sglang-0.5.17):
# free memory when it came to the prefill graph, or None where it captured it.
GPU_SKIPS = {0.93: None, 0.95: 3.67, 0.97: 2.04}


@pytest.mark.parametrize("fraction", sorted(GPU_SKIPS))
def test_the_prefill_graph_is_skipped_where_the_gpu_skipped_it(fraction: float) -> None:
    """0.5.16-0.5.17 start without the prefill graph below 4 GiB free; the twin playing 0.5.17
    does the same, logs SGLang's line and reports the graphs it kept, and runs."""
    args = ["--preset", H100.name, "--sglang-version", "0.5.17", "--time-scale", "1000"]
    with running_twin([*args, "--mem-fraction-static", str(fraction)]) as twin:
        info = httpx.get(twin.url + "/get_server_info", timeout=10).json()
        log = twin.log()
    graphs = info["internal_states"][0]["memory_usage"]["graph"]
    free = GPU_SKIPS[fraction]
    if free is None:
        assert "Disabling auto-selected prefill CUDA graph" not in log
        assert graphs["prefill"] == pytest.approx(1.473)
        return
    line = next(x for x in log.splitlines() if "Disabling auto-selected prefill" in x)
    said = float(line.split("only ")[1].split(" GiB")[0])
    assert said == pytest.approx(free, abs=0.35), line  # SGLang's figure less its eager buffers
    assert graphs == {**graphs, "prefill": 0.0, "decode": pytest.approx(0.455)}


def test_a_release_without_the_rule_captures_the_prefill_graph_whatever_is_free() -> None:
    for version in ("0.5.15", "0.5.18", "0.5.23"):
        hr = headroom(H100, 0.97, False, version=SGLangVersion.parse(version))
        assert not hr.prefill_graph_skipped and hr.graph_gib == pytest.approx(1.928), version
    hr = headroom(H100, 0.97, False, version=SGLangVersion.parse("0.5.16"))
    assert hr.prefill_graph_skipped and hr.activation_gib == pytest.approx(2.357 - 0.455, abs=0.01)
