"""The deployment shapes against SGLang 0.5.23's own formulas (cited in sim/shapes.py).

Attention DP at TP8 and the H100/H200 presets cannot run on the CPU tier, so the twin's figures
are checked here against the arithmetic of the SGLang functions it follows.
"""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sim.args import resolve
from sim.memory import effective_max_running_requests
from sim.models import GPT_OSS_120B, KIMI_K2_5, LLAMA_3_1_8B, LLAMA_3_1_8B_FP8
from sim.shapes import (
    KvShape,
    Layout,
    dp_attention_graph_reserve_mib,
    draft_cell_bytes,
    per_rank_chunked_prefill,
    resolve_layout,
    resolve_speculation,
)
from tests.twin_process import running_twin

V0523 = ["--sglang-version", "0.5.23"]


@pytest.mark.parametrize(
    ("tp", "dp", "attn_dp", "flag", "refactored", "want"),
    [
        (8, 8, 1, True, True, Layout(8, 1, 8, 1)),  # deprecated spelling -> attn_dp_size
        (8, 1, 4, False, True, Layout(8, 1, 4, 2)),  # --attn-dp-size
        (8, 2, 1, False, True, Layout(8, 2, 1, 8)),  # replicas, no attention DP
        (8, 8, 1, True, False, Layout(8, 1, 8, 1)),  # 0.5.5: the same schedulers
    ],
)
def test_layout(tp: int, dp: int, attn_dp: int, flag: bool, refactored: bool, want: Layout) -> None:
    assert resolve_layout(tp, dp, attn_dp, flag, refactored) == want


@pytest.mark.parametrize(("tp", "dp", "attn_dp"), [(8, 2, 4), (8, 1, 3)])
def test_layout_refused(tp: int, dp: int, attn_dp: int) -> None:
    with pytest.raises(ValueError):
        resolve_layout(tp, dp, attn_dp, False, True)


@pytest.mark.parametrize(
    ("max_bs", "attn_dp", "want"),
    [(512, 8, 512 * 8 * 3 + 512 * 8 * 1.5), (256, 8, 256 * 8 * 3), (512, 1, 0.0)],
)
def test_dp_attention_reserve(max_bs: int, attn_dp: int, want: float) -> None:
    assert dp_attention_graph_reserve_mib(max_bs, attn_dp) == want


@pytest.mark.parametrize(
    ("tokens", "context", "requested", "attn_dp", "want"),
    [
        (490_762, 262_144, None, 8, 2048),  # the request-pool estimate, per rank
        (490_762, 262_144, 48, 8, 6),  # the global cap divided by attention DP
        (490_762, 262_144, 1024, 8, 128),
        (1000, 8192, None, 1, 500),  # half the pool
        (397_262, 131_072, 9000, 1, 9000),  # no request-pool cap on a given value
    ],
)
def test_max_running_per_rank(
    tokens: int, context: int, requested: int | None, attn_dp: int, want: int
) -> None:
    assert effective_max_running_requests(tokens, context, requested, attn_dp) == want


def test_chunk_split_and_cells() -> None:
    assert per_rank_chunked_prefill(8192, 8) == 1024
    assert per_rank_chunked_prefill(-1, 8) == -1
    assert draft_cell_bytes(131_072, 1, 32) == 4096
    # MLA: the latent is replicated, so one rank's cell is the same at attention TP 1 or 8.
    assert KIMI_K2_5.cell_size("bf16", 1) == KIMI_K2_5.cell_size("bf16", 8) == 70_272
    assert LLAMA_3_1_8B_FP8.resolve_kv_dtype("auto") == "fp8_e4m3"
    assert LLAMA_3_1_8B.resolve_kv_dtype("auto") == "bf16"
    shape = GPT_OSS_120B.kv_shape("bf16")
    assert (shape.full_cell, shape.swa_cell) == (36_864, 36_864)
    assert shape.profile_cell == pytest.approx(36_864 * 1.8)
    assert KvShape(36_864, 36_864, 0.8).swa_tokens(67_953, 1) == 54_362


def test_speculation_defaults() -> None:
    spec = resolve_speculation("NEXTN", "LlamaForCausalLM", 0, "draft", None, None, None)
    assert spec is not None
    assert (spec.algorithm, spec.num_steps, spec.eagle_topk, spec.num_draft_tokens) == (
        "EAGLE",
        5,
        4,
        8,
    )
    with pytest.raises(ValueError):
        resolve_speculation("EAGLE", "LlamaForCausalLM", 0, None, None, None, None)


# The presets' figures, each recomputed from the formulas: pre 139.8 GiB, weights and other
# static memory per the preset, rest / cell.
PRESET_FIGURES = [
    # preset, extra flags, tokens per rank, cap per rank, schedulers, chunk per rank, fraction
    ("kimi-k2.5-h200-tp8-dpattn", [], 490_762, 2048, 8, 1024, 0.758),
    ("kimi-k2.5-h200-tp8-dpattn", ["--max-running-requests", "1024"], 490_762, 128, 8, 1024, 0.758),
    ("gpt-oss-120b-h100", [], 67_953, 2048, 1, 8192, 0.834),
    ("llama-3.1-8b-fp8kv-h100", [], 925_850, 3616, 1, 8192, 0.834),
    ("llama-3.1-8b-fp8kv-h100", ["--kv-cache-dtype", "fp8_e4m3"], 925_850, 3616, 1, 8192, 0.834),
    (
        "llama-3.1-8b-h100",
        ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "d"],
        400_662,  # (0.834 * 78.57 - 15.09) GiB over the draft-widened cell of 135,168 B
        48,
        1,
        8192,
        0.834,
    ),
]


@pytest.mark.parametrize(
    ("preset", "extra", "tokens", "cap", "schedulers", "chunk", "fraction"), PRESET_FIGURES
)
def test_preset_figures(
    preset: str,
    extra: list[str],
    tokens: int,
    cap: int,
    schedulers: int,
    chunk: int,
    fraction: float,
) -> None:
    cfg = resolve([*V0523, "--preset", preset, *extra])
    assert cfg.failure is None
    assert cfg.capacity.max_total_num_tokens == tokens
    assert cfg.max_running_requests == cap
    assert cfg.layout.schedulers == schedulers
    assert cfg.chunked_prefill_size == cfg.server_args["chunked_prefill_size"] == chunk
    assert cfg.server_args["mem_fraction_static"] == fraction


def test_dp_attention_fraction_from_memory_hook() -> None:
    # 143,771 MiB; reserve 512 + 8192*1.5 + 8/8*1024 + 512*2 + 1536 (MLA prefill graphs)
    # + 512*8*3 + 512*8*1.5 (DP attention, max_bs 512 > 300) = 34,816 MiB.
    assert round((143_771 - 34_816) / 143_771, 3) == 0.758
    cfg = resolve([*V0523, "--preset", "kimi-k2.5-h200-tp8-dpattn"])
    rest_gib = 139.8 - 69.25 - 4.6 - 139.8 * (1 - 0.758)
    assert cfg.capacity.max_total_num_tokens == int(rest_gib * (1 << 30) // 70_272)
    sa = cfg.server_args
    assert (sa["dp_size"], sa["attn_dp_size"], sa["enable_dp_attention"]) == (1, 8, True)
    assert sa["schedule_conservativeness"] == pytest.approx(0.3)


def test_fp8_checkpoint_reports_auto() -> None:
    cfg = resolve([*V0523, "--preset", "llama-3.1-8b-fp8kv-h100"])
    assert cfg.server_args["kv_cache_dtype"] == "auto"
    assert cfg.kv_dtype == "fp8_e4m3"
    assert cfg.capacity.cell_size == 65_536


def _labels(text: str, family: str) -> list[dict[str, str]]:
    for fam in text_string_to_metric_families(text):
        if fam.name == family:
            return [dict(s.labels) for s in fam.samples]
    return []


def test_dp_attention_twin_endpoints() -> None:
    args = [*V0523, "--preset", "kimi-k2.5-h200-tp8-dpattn", "--time-scale", "2000"]
    with running_twin([*args, "--enable-metrics", "--max-running-requests", "64"]) as proc:
        for _ in range(8):
            httpx.post(proc.url + "/generate", json={"text": "a b", "sampling_params": {}})
        info = httpx.get(proc.url + "/server_info").json()
        loads = httpx.get(proc.url + "/v1/loads").json()["loads"]
        text = httpx.get(proc.url + "/metrics").text
    assert info["max_total_num_tokens"] == 490_762  # one rank's pool
    states = info["internal_states"]
    assert [s["dp_rank"] for s in states] == list(range(8))
    assert {s["effective_max_running_requests_per_dp"] for s in states} == {8}
    assert [x["dp_rank"] for x in loads] == list(range(8))
    got = {(x["dp_rank"], x["tp_rank"]) for x in _labels(text, "sglang:num_running_reqs")}
    assert got == {(str(r), str(r)) for r in range(8)}


def test_hybrid_swa_and_label_sets() -> None:
    args = [*V0523, "--preset", "gpt-oss-120b-h100", "--time-scale", "2000", "--enable-metrics"]
    extra = [
        "--enable-priority-scheduling",
        "--tp-size",
        "2",
        "--enable-metrics-for-all-schedulers",
        "--decode-log-interval",
        "1",
    ]
    with running_twin([*args, *extra]) as proc:
        for priority in (1, 2):
            body = {"text": "a b", "priority": priority, "sampling_params": {"max_new_tokens": 8}}
            httpx.post(proc.url + "/generate", json=body)
        info = httpx.get(proc.url + "/server_info").json()
        text = httpx.get(proc.url + "/metrics").text
    usage = info["internal_states"][0]["memory_usage"]
    assert usage["token_capacity_swa"] == int(usage["token_capacity"] * 0.8)
    assert _labels(text, "sglang:max_total_num_tokens_swa")
    assert _labels(text, "sglang:swa_token_usage")
    queue = _labels(text, "sglang:num_queue_reqs")
    # the warm-up request carries no priority: the scheduler gives it the lowest
    # (scheduler.py::_set_or_validate_priority), as the real server's scrape shows
    lowest = str(-(2**63))
    assert {(x["tp_rank"], x["priority"]) for x in queue} == {
        (tp, p) for tp in ("0", "1") for p in ("", lowest, "1", "2")
    }
    assert all("dp_rank" not in x for x in queue)
