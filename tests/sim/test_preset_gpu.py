"""The twin's `llama-3.1-8b-h100` preset held to what the real SGLang 0.5.17 showed on an H100
80GB (Llama-3-8B in bf16, random weights; the first GPU run, 2026-12-05/06): its capacity at
ten fractions, its weights and CUDA graphs, its start-up, and its decode steps under the
incident-like load (150 closed-loop clients, prompts U(400,1000), outputs U(1000,4000)).

A running request of that load holds ~2,100 KV tokens on average (its prompt, 700, plus the
time-weighted half of its output, E[L^2] / 2E[L] = 1,400), so 57 running requests read ~120K
tokens a step and 150 read ~315K; the H200 recording of the same load measured 2,113."""

from __future__ import annotations

import pytest

from sim.memory import headroom, plan_capacity
from sim.presets import PRESETS
from sim.version import SGLangVersion
from tests.playbooks.engines.sglang.test_gpu_capacity import REAL  # SGLang's, on the H100

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
