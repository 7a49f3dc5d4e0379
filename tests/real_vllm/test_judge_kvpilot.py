"""kvpilot's vLLM KV-capacity predictions judged by vLLM 0.32.0's own sizing code, shape by shape.

For each model shape the judge (`judge.py`, run once under the vLLM venv) builds every layer's
KV spec with vLLM's own classes and sizes the pool with vLLM's own `get_kv_cache_configs`: as
the server runs now, and after one change (utilization, FP8 KV, block size, the KV bytes flag).
kvpilot reads the first as a real server reports it (`vllm:cache_config_info` labels, the flags,
the GPU's total memory, the model's config.json) and predicts the second with its capacity
model; blocks and usable tokens must be within TOLERANCE of vLLM's, and where vLLM refuses to
start (one max_model_len request does not fit) kvpilot must say so too.

The profile run is not judged: its non-KV figure (weights, activations, CUDA graphs) is given
per shape, as a real server's profile would have measured it, and it is the same before and
after a change, as on a real server (capacity.py's module docstring).

`pytest -s` prints the matrix (predicted vs vLLM per shape).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from playbooks.engines.vllm.capacity import GIB, CapacityModel, GpuMemory
from playbooks.engines.vllm.client import parse_settings
from playbooks.engines.vllm.geometry import geometry_of, with_draft
from playbooks.engines.vllm.metrics import capacity_tokens
from playbooks.engines.vllm.rules import capacity_model

from .harness import MARKS, vllm_python

pytestmark = MARKS

JUDGE = Path(__file__).resolve().parent / "judge.py"
TOLERANCE = 0.02
MIB = 1 << 20
H200 = 143_771 * MIB  # nvidia-smi memory.total, what NVML gives kvpilot
H100 = 81_559 * MIB


# ----------------------------------------------------------------------------- shapes
def full(heads: int, size: int) -> dict[str, Any]:
    return {"type": "full", "kv_heads": heads, "head_size": size}


def sliding(heads: int, size: int, window: int) -> dict[str, Any]:
    return {"type": "sliding", "kv_heads": heads, "head_size": size, "window": window}


@dataclass(frozen=True)
class Model:
    """A model as kvpilot reads it (`config`, its config.json) and as vLLM's attention layers
    describe it to the KV sizing (`layers`, one per attention layer, heads before TP)."""

    name: str
    config: dict[str, Any]
    layers: list[dict[str, Any]]
    window: int | None = None  # what vLLM's cache_config_info reports as `sliding_window`
    # `--speculative-config` as kvpilot reads it, and the draft head's config.json (None: not
    # readable where the bot runs); `layers` then holds the drafter's layers too
    speculative: dict[str, Any] = field(default_factory=dict)
    draft_config: dict[str, Any] | None = None


LLAMA_8B = Model(
    "Llama-3.1-8B",
    {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
     "hidden_size": 4096, "max_position_embeddings": 131072},
    [full(8, 128)] * 32,
)  # fmt: skip
LLAMA_70B = Model(
    "Llama-3.1-70B",
    {"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
     "hidden_size": 8192, "max_position_embeddings": 131072},
    [full(8, 128)] * 80,
)  # fmt: skip
QWEN3_235B = Model(  # 4 KV heads: at TP 8 every rank keeps a replica of one
    "Qwen3-235B-A22B",
    {"num_hidden_layers": 94, "num_attention_heads": 64, "num_key_value_heads": 4,
     "head_dim": 128, "hidden_size": 4096, "max_position_embeddings": 40960},
    [full(4, 128)] * 94,
)  # fmt: skip
DEEPSEEK_V3 = Model(
    "DeepSeek-V3",
    {"num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
     "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
     "v_head_dim": 128, "max_position_embeddings": 163840},
    [{"type": "mla", "kv_heads": 1, "head_size": 576}] * 61,
)  # fmt: skip
EAGLE_HEAD_8B = {  # yuhuili/EAGLE-LLaMA3.1-Instruct-8B: one decoder layer of the target's shape
    "num_hidden_layers": 1, "num_attention_heads": 32, "num_key_value_heads": 8,
    "hidden_size": 4096, "max_position_embeddings": 2048,
}  # fmt: skip
LLAMA_8B_EAGLE = replace(  # the drafter's layer is sized in the target's blocks
    LLAMA_8B,
    name="Llama-3.1-8B + EAGLE head",
    layers=[full(8, 128)] * 33,
    speculative={"speculative_method": "eagle", "speculative_model": "eagle-llama3.1-8b"},
    draft_config=EAGLE_HEAD_8B,
)
LLAMA_8B_EAGLE3_UNREAD = replace(  # the head's config not readable: one layer assumed
    LLAMA_8B_EAGLE,
    name="Llama-3.1-8B + EAGLE-3 head (config unread)",
    speculative={"speculative_method": "eagle3", "speculative_model": "eagle3-llama3.1-8b"},
    draft_config=None,
)
DEEPSEEK_V3_MTP = replace(  # the MTP module: num_nextn_predict_layers MLA layers
    DEEPSEEK_V3,
    name="DeepSeek-V3 + MTP",
    config={**DEEPSEEK_V3.config, "num_nextn_predict_layers": 1},
    layers=[{"type": "mla", "kv_heads": 1, "head_size": 576}] * 62,
    speculative={"speculative_method": "mtp", "num_speculative_tokens": 1},
)
GPT_OSS = Model(
    "gpt-oss-120b",
    {"num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 8,
     "head_dim": 64, "sliding_window": 128, "max_position_embeddings": 131072,
     "layer_types": ["sliding_attention", "full_attention"] * 18},
    [sliding(8, 64, 128), full(8, 64)] * 18,
    window=128,
)  # fmt: skip
GEMMA3_27B = Model(  # every 6th layer full: 10 full, 52 sliding (groups padded)
    "Gemma-3-27B",
    {"text_config": {"num_hidden_layers": 62, "num_attention_heads": 32,
                     "num_key_value_heads": 16, "head_dim": 128, "sliding_window": 1024,
                     "sliding_window_pattern": 6, "max_position_embeddings": 131072}},
    [full(16, 128) if (i + 1) % 6 == 0 else sliding(16, 128, 1024) for i in range(62)],
    window=1024,
)  # fmt: skip


@dataclass(frozen=True)
class Server:
    """One engine's launch (per GPU) and what its profile run measured besides the KV cache."""

    model: Model
    gpu_bytes: int
    utilization: float
    non_kv_gib: float
    tp: int = 1
    block_size: int = 16
    kv_dtype: str = "auto"
    kv_bytes: int | None = None  # --kv-cache-memory-bytes
    max_model_len: int = 131072
    max_num_batched_tokens: int = 8192

    def changed(self, change: dict[str, Any]) -> Server:
        """The server relaunched with `change` (keys as `CapacityModel.tokens_after` takes)."""
        names = {"dtype": "kv_dtype"}
        return replace(self, **{names.get(k, k): v for k, v in change.items()})

    def case(self, name: str) -> dict[str, Any]:
        return {
            "name": name,
            "layers": self.model.layers,
            "block_size": self.block_size,
            "kv_dtype": self.kv_dtype,
            "tp": self.tp,
            "max_model_len": self.max_model_len,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "total_bytes": self.gpu_bytes,
            "utilization": self.utilization,
            "non_kv_bytes": int(self.non_kv_gib * GIB),
            "kv_cache_memory_bytes": self.kv_bytes,
        }


@dataclass(frozen=True)
class Pair:
    name: str
    running: Server
    change: dict[str, Any]
    refused_by_vllm: bool = False  # what the pair is meant to show; checked against vLLM


L8 = Server(LLAMA_8B, H200, 0.9, 17.5)
L70 = Server(LLAMA_70B, H100, 0.9, 38.0, tp=4)
QW = Server(QWEN3_235B, H200, 0.9, 62.0, tp=8, max_model_len=40960)
DS = Server(DEEPSEEK_V3, H200, 0.9, 88.0, tp=8, block_size=64, max_model_len=163840)
L8_EAGLE = Server(LLAMA_8B_EAGLE, H200, 0.9, 18.3)
L8_EAGLE3 = Server(LLAMA_8B_EAGLE3_UNREAD, H100, 0.85, 18.3)
DS_MTP = replace(DS, model=DEEPSEEK_V3_MTP, non_kv_gib=89.5)
OSS = Server(GPT_OSS, H200, 0.9, 68.0)
GEMMA = Server(GEMMA3_27B, H100, 0.9, 32.0, tp=2)

PAIRS = [
    Pair("Llama-8B TP1, u 0.9->0.95", L8, {"utilization": 0.95}),
    Pair("Llama-8B TP1, u 0.9->0.6", L8, {"utilization": 0.6}),
    Pair("Llama-8B TP1, fp8 KV", L8, {"dtype": "fp8"}),
    Pair("Llama-8B TP1, block 32", L8, {"block_size": 32}),
    Pair("Llama-8B TP1, fp8 + u 0.95", L8, {"dtype": "fp8", "utilization": 0.95}),
    Pair("Llama-8B TP1, KV bytes 40 GiB", L8, {"kv_bytes": 40 * GIB}),
    Pair("Llama-8B TP1, u 0.9->0.12 (no KV room)", L8, {"utilization": 0.12}, refused_by_vllm=True),
    Pair("Llama-8B TP1, u 0.9->0.2 (too small)", L8, {"utilization": 0.2}, refused_by_vllm=True),
    Pair(
        "Llama-8B TP1, u 0.9->0.23 (one request short)",
        L8,
        {"utilization": 0.23},
        refused_by_vllm=True,
    ),
    Pair(
        "Llama-8B, KV bytes 20 GiB -> u 0.5 (flag wins)",
        replace(L8, kv_bytes=20 * GIB),
        {"utilization": 0.5},
    ),
    Pair("Llama-70B TP4 H100, u 0.9->0.95", L70, {"utilization": 0.95}),
    Pair("Llama-70B TP4 H100, fp8 KV", L70, {"dtype": "fp8"}),
    Pair("Llama-70B TP4 H100, u 0.9->0.6", L70, {"utilization": 0.6}, refused_by_vllm=True),
    Pair("Qwen3-235B TP8 (replicated heads), u 0.95", QW, {"utilization": 0.95}),
    Pair("Qwen3-235B TP8, fp8 KV", QW, {"dtype": "fp8"}),
    Pair("DeepSeek-V3 MLA TP8, u 0.9->0.95", DS, {"utilization": 0.95}),
    Pair("DeepSeek-V3 MLA TP8, fp8 KV", DS, {"dtype": "fp8"}),
    Pair("DeepSeek-V3 MLA TP8, KV bytes 30 GiB", DS, {"kv_bytes": 30 * GIB}),
    Pair("Llama-8B + EAGLE, u 0.9->0.95", L8_EAGLE, {"utilization": 0.95}),
    Pair("Llama-8B + EAGLE, u 0.9->0.45", L8_EAGLE, {"utilization": 0.45}),
    Pair("Llama-8B + EAGLE, fp8 KV + u 0.95", L8_EAGLE, {"dtype": "fp8", "utilization": 0.95}),
    Pair("Llama-8B + EAGLE-3 H100, u 0.85->0.95", L8_EAGLE3, {"utilization": 0.95}),
    Pair("DeepSeek-V3 + MTP TP8, u 0.9->0.95", DS_MTP, {"utilization": 0.95}),
    Pair("gpt-oss-120b SWA, u 0.9->0.95", OSS, {"utilization": 0.95}),
    Pair("gpt-oss-120b SWA, u 0.9->0.7", OSS, {"utilization": 0.7}),
    Pair("gpt-oss-120b SWA, fp8 KV", OSS, {"dtype": "fp8"}),
    Pair("gpt-oss-120b SWA, block 32", OSS, {"block_size": 32}),
    Pair("gpt-oss-120b SWA, KV bytes 16 GiB", OSS, {"kv_bytes": 16 * GIB}),
    # one 131,072-token request takes 8,192 full + 1,033 window blocks of 18 pages: 5.1 GiB
    Pair(
        "gpt-oss-120b SWA, u 0.9->0.51 (one request short)",
        OSS,
        {"utilization": 0.51},
        refused_by_vllm=True,
    ),
    Pair("Gemma-3-27B SWA TP2 H100, u 0.9->0.95", GEMMA, {"utilization": 0.95}),
    Pair("Gemma-3-27B SWA TP2 H100, fp8 KV", GEMMA, {"dtype": "fp8"}),
]

GRID_GPUS_GIB = (24, 40, 48, 80, 96, 141, 192)
GRID_MODELS = (  # model, TP, block size
    (LLAMA_8B, 1, 16),
    (QWEN3_235B, 8, 16),
    (DEEPSEEK_V3, 8, 64),
    (GPT_OSS, 1, 16),
    (GEMMA3_27B, 2, 16),
)


def grid_pairs(n: int = 40, seed: int = 7) -> list[Pair]:
    """Seeded draws over GPU sizes, utilizations and shapes. The non-KV share of the GPU is
    drawn too (any model "fits" some GPU once sharded enough); some draws leave no room for one
    request after the change, and there kvpilot must refuse as vLLM does."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        gib = rng.choice(GRID_GPUS_GIB)
        model, tp, block = rng.choice(GRID_MODELS)
        u0, u1 = (round(rng.uniform(0.5, 0.95), 3) for _ in range(2))
        non_kv = round(rng.uniform(0.15, 0.6) * gib, 2)
        length = rng.choice((4096, 32768, 131072))
        running = Server(model, gib * GIB, u0, non_kv, tp, block, max_model_len=length)
        change: dict[str, Any] = {"utilization": u1}
        if rng.random() < 0.3:
            change["dtype"] = "fp8"
        name = f"grid {i}: {gib} GiB {model.name} TP{tp} {u0}->{u1}"
        out.append(Pair(name + (" fp8" if "dtype" in change else ""), running, change))
    return out


GRID = grid_pairs()


# ----------------------------------------------------------------------------- the judge
@dataclass(frozen=True)
class Judged:
    by_name: dict[str, dict[str, Any]]
    timing: dict[str, Any]


def run_judge(cases: list[dict[str, Any]]) -> Judged:
    began = time.perf_counter()
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [str(vllm_python()), str(JUDGE)],
        input=json.dumps({"cases": cases}),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout)
    timing = {**out["timing"], "wall_s": round(time.perf_counter() - began, 1)}
    return Judged({r["name"]: r for r in out["results"]}, timing)


@pytest.fixture(scope="module")
def judged() -> Judged:
    cases = []
    for p in PAIRS + GRID:
        cases += [p.running.case(p.name + " /running"), p.running.changed(p.change).case(p.name)]
    return run_judge(cases)


# ----------------------------------------------------------------------------- kvpilot
def reported_tokens(s: Server, result: dict[str, Any]) -> int:
    """The capacity kvpilot reads off a server sized as `result`: from the labels vLLM's
    `vllm:cache_config_info` carries (block count, block size, its own token figure, the
    sliding window), with kvpilot's own reading of them."""
    labels = {
        "num_gpu_blocks": str(result["num_blocks"]),
        "block_size": str(s.block_size),
        "kv_cache_size_tokens": str(result["kv_cache_size_tokens"]),
        "sliding_window": str(s.model.window),
    }
    tokens = capacity_tokens(labels, 1)
    assert tokens is not None
    return tokens


def kvpilot_model(s: Server, result: dict[str, Any]) -> CapacityModel:
    """kvpilot's capacity model of the running server, built from its reported settings."""
    info = parse_settings(
        {
            "version": "0.32.0",
            "model": s.model.name,
            "engines": 1,
            "num_gpu_blocks": result["num_blocks"],
            "capacity_tokens": reported_tokens(s, result),
            "gpu_memory_utilization": s.utilization,
            "kv_cache_memory_bytes": s.kv_bytes,
            "kv_cache_dtype": s.kv_dtype,
            "block_size": s.block_size,
            "max_model_len": s.max_model_len,
            "tensor_parallel_size": s.tp,
            **s.model.speculative,
        }
    )
    gpu = GpuMemory(s.gpu_bytes / GIB, "the judge's GPU")
    geometry = geometry_of(s.model.config)
    method = s.model.speculative.get("speculative_method")
    if geometry is not None and method:
        geometry, _ = with_draft(geometry, method, s.model.config, s.model.draft_config)
    return capacity_model(info, gpu, geometry)


def error(predicted: float | None, real: float) -> float:
    if predicted is None:
        return float("inf")
    return abs(predicted - real) / real if real else float(predicted != real)


@dataclass
class Row:
    pair: Pair
    blocks: tuple[int | None, int | None] = (None, None)  # kvpilot, vLLM
    tokens: tuple[int | None, int | None] = (None, None)
    fits: tuple[bool | None, bool] = (True, True)  # kvpilot (None: cannot say), vLLM
    notes: list[str] = field(default_factory=list)

    @property
    def worst(self) -> float:
        """Relative error of blocks and tokens where vLLM started (0 where it refused)."""
        return max(
            (error(a, b) for a, b in (self.blocks, self.tokens) if b is not None), default=0.0
        )

    @property
    def agrees(self) -> bool:
        return self.fits[0] == self.fits[1] and self.worst <= TOLERANCE

    def line(self) -> str:
        def show(p: tuple[int | None, int | None]) -> str:
            if p[1] is None:
                return f"{p[0] if p[0] is not None else '-'} / refused"
            ours = "None" if p[0] is None else f"{p[0]:,}"
            return f"{ours} / {p[1]:,} ({error(p[0], p[1]):.2%})"

        fits = "/".join("unknown" if f is None else "starts" if f else "refused" for f in self.fits)
        return " | ".join((self.pair.name, show(self.blocks), show(self.tokens), fits))


def compare(pair: Pair, judged: Judged) -> Row | None:
    """None where vLLM refused the running server itself (a grid draw with no room)."""
    before = judged.by_name[pair.name + " /running"]
    after = judged.by_name[pair.name]
    if "error" in before:
        return None
    cap = kvpilot_model(pair.running, before)
    blocks = cap.blocks_after(**{"utilization": cap.utilization, **pair.change})
    tokens = cap.tokens_after(**pair.change)
    fits = None if tokens is None else cap.one_request_fits(tokens)
    row = Row(pair, fits=(fits, "error" not in after))
    if "error" in after:
        row.blocks, row.tokens = (blocks, None), (tokens, None)
        row.notes.append(after["error"][:120])
    else:
        after_server = pair.running.changed(pair.change)
        row.blocks = (blocks, int(after["num_blocks"]))
        row.tokens = (tokens, reported_tokens(after_server, after))
    return row


def print_matrix(title: str, rows: list[Row]) -> None:
    print(f"\n{title}\nshape, change | blocks kvpilot / vLLM | tokens kvpilot / vLLM | start")
    for row in rows:
        print(row.line())


# ----------------------------------------------------------------------------- tests
def test_kvpilot_predicts_the_pool_vllm_sizes(judged: Judged) -> None:
    rows = [compare(p, judged) for p in PAIRS]
    assert all(r is not None for r in rows), "a running server of PAIRS did not start"
    found = [r for r in rows if r is not None]
    print_matrix("vLLM 0.32.0 KV pool after a change: kvpilot vs vLLM's own sizing", found)
    print(f"worst error {max(r.worst for r in found if r.fits[1]):.3%}; judge {judged.timing}")
    assert [(r.pair.name, not r.fits[1]) for r in found] == [
        (p.name, p.refused_by_vllm) for p in PAIRS
    ], "a pair's refusal is not what the pair says it shows"
    wrong = [r.line() for r in found if not r.agrees]
    assert not wrong, "\n".join(wrong)


def test_the_grid_of_gpus_and_utilizations(judged: Judged) -> None:
    rows = [r for r in (compare(p, judged) for p in GRID) if r is not None]
    refused = sum(1 for r in rows if not r.fits[1])
    worst = max(r.worst for r in rows if r.fits[1])
    print_matrix(f"{len(rows)} grid pairs ({refused} refused by vLLM after the change)", rows)
    print(f"worst error {worst:.3%}")
    assert len(rows) >= len(GRID) // 2, "too few grid draws started: widen the draw"
    wrong = [r.line() for r in rows if not r.agrees]
    assert not wrong, "\n".join(wrong)
