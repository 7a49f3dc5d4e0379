"""kvpilot's SGLang arithmetic judged by SGLang 0.5.23's own code, shape by shape.

For each deployment shape the judge (tests/real_sglang/judge) runs SGLang's own argument
resolution and KV-cache configurator twice: as the server runs now, and after a change. kvpilot
reads the first as a real server reports it (`/server_info` shaped like 0.5.23's, the same free
GPU memory before the weights load) and predicts the second: KV capacity over all attention-DP
ranks, the per-rank running-request cap, the host pool, and whether SGLang refuses the change.
SGLang's default reserve is compared where SGLang derived the fraction itself.

`pytest -s` prints the matrix (predicted vs SGLang per shape), which BENCHMARKS.md quotes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from playbooks.engines.sglang.capacity import GpuMemory
from playbooks.engines.sglang.client import ServerInfo, parse_server_info
from playbooks.engines.sglang.deployment import attn_dp_size, deployment_of, parse_version
from playbooks.engines.sglang.facts import Server, ranks_on_host
from playbooks.engines.sglang.geometry import geometry_of
from playbooks.engines.sglang.hicache import host_pool_tokens
from playbooks.engines.sglang.proposed_change import Change
from playbooks.engines.sglang.reserve import sglang_reserve
from playbooks.engines.sglang.rules import capacity_model
from playbooks.engines.sglang.verdicts import judge_change
from playbooks.sources.host import HostMemory

from .harness import sglang_env_available
from .judge import MODELS, Shape, judge_with_timing

pytestmark = [
    pytest.mark.real_sglang,
    pytest.mark.slow,
    pytest.mark.skipif(
        not sglang_env_available(),
        reason="real SGLang environment not installed (run tests/real_sglang/setup.sh)",
    ),
]

H200_MIB = 143771.0
PRE = 140.0  # free GiB before the weights load on an idle H200
GIB = 1 << 30
TOLERANCE = 0.02
ACTIVATION_FLOOR = "remain for activations, below the"
SPEC = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3"]
SPEC += ["--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def flags_of(change: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in change.items():
        flag = "--" + key.replace("_", "-")
        out += [flag] if value is True else [flag, str(value)]
    return out


@dataclass
class Pair:
    """A server as it runs and one change to it; `changed` adds the change's flags."""

    name: str
    running: Shape
    change: dict[str, Any]
    drop: tuple[str, ...] = ()  # flags of the running server the change replaces
    refused_by_sglang: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def changed(self) -> Shape:
        args, skip = [], False
        for i, token in enumerate(self.running.args):
            if skip:
                skip = False
                continue
            if token in self.drop:
                nxt = self.running.args[i + 1] if i + 1 < len(self.running.args) else ""
                skip = not nxt.startswith("--")
                continue
            args.append(token)
        return replace(self.running, name=self.name + "/changed", args=args + flags_of(self.change))


def shape(name: str, model: str, args: list[str], weights: float, **kw: Any) -> Shape:
    return Shape(name, model, args, H200_MIB, PRE, weights, **kw)


MFS = "--mem-fraction-static"
HOST = {"host_available_gib": 2000.0, "host_cgroup_limit_gib": 1000.0, "ranks_per_host": 8}
DENSE_TP1 = shape("dense GQA TP1", "llama-3.1-8b", [MFS, "0.85"], 15.0)
DENSE_TP2 = shape("dense GQA TP2", "llama-3.1-8b", ["--tp", "2", MFS, "0.85"], 8.0)
MLA_TP8 = shape("MLA TP8", "deepseek-v3-bf16", ["--tp", "8", MFS, "0.85"], 80.0)
MLA_DP8 = shape(
    "MLA DP attention x8",
    "deepseek-v3-bf16",
    ["--tp", "8", "--attn-dp-size", "8", "--max-running-requests", "512", MFS, "0.85"],
    80.0,
)
MLA_SPEC = shape(
    "MLA speculative (EAGLE)", "deepseek-v3-fp8", ["--tp", "8", *SPEC, MFS, "0.85"], 80.0
)
FP8_AUTO = shape("FP8 checkpoint, auto", "deepseek-v3-fp8-kv", ["--tp", "8", MFS, "0.85"], 80.0)
SWA = shape("hybrid SWA (gpt-oss)", "gpt-oss-120b", [MFS, "0.85"], 65.0)
MAMBA = shape("hybrid mamba (Qwen3-Next)", "qwen3-next-80b", ["--tp", "4", MFS, "0.85"], 40.0)
DENSE_DP2 = shape(
    "dense GQA TP4 x DP2 replicas",
    "llama-3.1-8b",
    ["--tp", "4", "--dp-size", "2", "--max-running-requests", "200", MFS, "0.85"],
    4.0,
)
DENSE_TP8_HOST = shape(
    "dense TP8, HiCache off", "llama-3.1-8b", ["--tp", "8", MFS, "0.85"], 2.0, **HOST
)

PAIRS = [
    Pair("dense GQA TP1", DENSE_TP1, {"mem_fraction_static": 0.9}, (MFS,)),
    Pair("dense GQA TP2, fraction", DENSE_TP2, {"mem_fraction_static": 0.9}, (MFS,)),
    Pair("dense GQA TP2, FP8 KV", DENSE_TP2, {"kv_cache_dtype": "fp8_e4m3"}),
    Pair("MLA TP8, fraction", MLA_TP8, {"mem_fraction_static": 0.88}, (MFS,)),
    Pair("MLA TP8, FP8 KV", MLA_TP8, {"kv_cache_dtype": "fp8_e4m3"}),
    Pair("MLA TP8 -> DP attention x8", MLA_TP8, {"attn_dp_size": 8}),
    Pair(
        "MLA DP attention, cap",
        MLA_DP8,
        {"max_running_requests": 1024},
        ("--max-running-requests",),
    ),
    Pair("MLA DP attention, fraction", MLA_DP8, {"mem_fraction_static": 0.88}, (MFS,)),
    # replicas: the cap is each replica's own, the pool each replica's (one reported)
    Pair(
        "dense TP4 x DP2 replicas, cap",
        DENSE_DP2,
        {"max_running_requests": 400},
        ("--max-running-requests",),
    ),
    Pair("dense TP4 x DP2 replicas, fraction", DENSE_DP2, {"mem_fraction_static": 0.9}, (MFS,)),
    Pair("MLA speculative, fraction", MLA_SPEC, {"mem_fraction_static": 0.88}, (MFS,)),
    Pair("FP8 checkpoint, auto -> fp8_e4m3", FP8_AUTO, {"kv_cache_dtype": "fp8_e4m3"}),
    Pair("FP8 checkpoint, fraction", FP8_AUTO, {"mem_fraction_static": 0.88}, (MFS,)),
    Pair("hybrid SWA, fraction", SWA, {"mem_fraction_static": 0.88}, (MFS,)),
    Pair("hybrid mamba, fraction", MAMBA, {"mem_fraction_static": 0.88}, (MFS,)),
    Pair(
        "HiCache off -> ratio 2 (over the budget)",
        DENSE_TP8_HOST,
        {"enable_hierarchical_cache": True, "hicache_ratio": 2},
        refused_by_sglang=True,
    ),
    # neither ratio nor size: 0.5.23 lowers the ratio until 0.8 of the host fits
    Pair("HiCache off -> on, sized by SGLang", DENSE_TP8_HOST, {"enable_hierarchical_cache": True}),
    Pair(
        "HiCache off -> ratio 0.5",
        DENSE_TP8_HOST,
        {"enable_hierarchical_cache": True, "hicache_ratio": 0.5},
    ),
    Pair(
        "HiCache off -> 40 GB per rank",
        DENSE_TP8_HOST,
        {"enable_hierarchical_cache": True, "hicache_size": 40},
    ),
    Pair(
        "HiCache over the container's limit",
        replace(DENSE_TP8_HOST, host_cgroup_limit_gib=100.0),
        {"enable_hierarchical_cache": True, "hicache_size": 40},
        refused_by_sglang=True,
    ),
    Pair(
        "weights leave no KV room",
        shape("dense TP1, heavy", "llama-3.1-8b", [MFS, "0.95"], 120.0),
        {"mem_fraction_static": 0.85},
        (MFS,),
        refused_by_sglang=True,
    ),
]
# SGLang derives the fraction itself: its reserve against kvpilot's copy of the formula.
DEFAULTS = [
    shape("default: dense TP1", "llama-3.1-8b", [], 15.0),
    shape("default: dense TP8", "llama-3.1-8b", ["--tp", "8"], 2.0),
    shape("default: MLA TP8", "deepseek-v3-bf16", ["--tp", "8"], 80.0),
    shape(
        "default: MLA DP attention x8",
        "deepseek-v3-bf16",
        ["--tp", "8", "--attn-dp-size", "8"],
        80.0,
    ),
    shape("default: no prefill graphs", "llama-3.1-8b", ["--disable-prefill-cuda-graph"], 15.0),
    shape("default: VLM (Qwen2.5-VL-7B)", "qwen2.5-vl-7b", [], 16.0),
    shape("default: VLM, language only", "qwen2.5-vl-7b", ["--language-only"], 16.0),
    shape("default: 80 GB H100", "llama-3.1-8b", [], 15.0),
]
DEFAULTS[-1] = replace(DEFAULTS[-1], gpu_mib=81559.0, pre_gib=79.0)


def grid_pairs(n: int = 24, seed: int = 15) -> list[Pair]:
    """Seeded draws over GPU sizes, models and fractions: the property the matrix samples."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        gib = rng.choice((24, 40, 48, 80, 96, 141, 192))
        model, weights = rng.choice((("llama-3.1-8b", 15.0 / 4), ("deepseek-v3-bf16", 80.0 / 8)))
        tp = "4" if model == "llama-3.1-8b" else "8"
        f0 = round(rng.uniform(0.6, 0.9), 3)
        f1 = round(min(0.95, f0 + rng.uniform(-0.1, 0.08)), 3)
        running = Shape(
            f"grid-{i}", model, ["--tp", tp, MFS, str(f0)], gib * 1024.0, gib - 0.5, weights
        )
        out.append(
            Pair(f"grid {gib} GiB {model} {f0}->{f1}", running, {"mem_fraction_static": f1}, (MFS,))
        )
    return out


GRID = grid_pairs()


@dataclass(frozen=True)
class Judged:
    by_name: dict[str, dict[str, Any]]
    timing: dict[str, Any]


@pytest.fixture(scope="module")
def judged() -> Judged:
    shapes = [p.running for p in PAIRS + GRID] + [p.changed for p in PAIRS + GRID] + DEFAULTS
    unique = list(
        {s.name + repr(s.args) + repr(s.host_cgroup_limit_gib): s for s in shapes}.values()
    )
    results, timing = judge_with_timing(unique)
    return Judged({r["name"]: r for r in results}, timing)


def kvpilot_server(s: Shape, result: dict[str, Any]) -> Server:
    """The server as kvpilot sees it: the reply, the free GPU memory, the model's config."""
    assert result["accepted"], result.get("error")
    info: ServerInfo = parse_server_info(result["server_info"])
    gpu = GpuMemory(s.pre_gib, "the judge's free memory before weights", True, s.gpu_mib)
    geometry = geometry_of(MODELS[s.model])
    cap = capacity_model(info, float(info.arg("mem_fraction_static")), gpu, geometry)
    host = None
    if s.host_available_gib is not None:
        limit = min(s.host_available_gib, s.host_cgroup_limit_gib or s.host_available_gib)
        host = HostMemory(int(limit * GIB), int(limit * GIB), "judge")
    return Server(info, cap, host, ranks_on_host(info), parse_version(info.version))


def sglang_capacity(result: dict[str, Any]) -> int:
    """Every scheduler's pool: attention-DP ranks, or `--dp-size` replicas (SGLang 0.5.23
    resolves the two exclusive; each replica sizes the pool one scheduler reports)."""
    resolved = result["resolved"]
    return (
        int(result["max_total_num_tokens"])
        * int(resolved["attn_dp_size"] or 1)
        * int(resolved["dp_size"] or 1)
    )


def error(predicted: float, real: float) -> float:
    return abs(predicted - real) / real if real else float(predicted != real)


@dataclass
class Row:
    shape: str
    capacity: tuple[int, int] | None = None  # (kvpilot, SGLang)
    cap_per_rank: tuple[int, int] | None = None
    host_pool: tuple[int, int] | None = None
    refused: tuple[bool, bool] | None = None
    kvpilot_reasons: tuple[str, ...] = ()

    @property
    def refusals_agree(self) -> bool:
        """kvpilot refuses what SGLang refuses; beyond that only what the docs justify: a
        fraction that starts but leaves activations less than the floor (docs/playbooks.md)."""
        if self.refused is None or self.refused[0] == self.refused[1]:
            return True
        ours, theirs = self.refused
        return ours and not theirs and any(ACTIVATION_FLOOR in r for r in self.kvpilot_reasons)

    def errors(self) -> list[float]:
        pairs = [self.capacity, self.cap_per_rank, self.host_pool]
        return [error(a, b) for a, b in (p for p in pairs if p is not None)]

    def line(self) -> str:
        def show(p: tuple[Any, Any] | None) -> str:
            if p is None:
                return "-"
            if isinstance(p[0], bool):
                ours = "refused" if p[0] else "allowed"
                if p[0] and not p[1] and self.refusals_agree:
                    ours = "refused (activation floor)"
                return f"{ours} / {'refused' if p[1] else 'allowed'}"
            return f"{p[0]:,} / {p[1]:,} ({error(p[0], p[1]):.2%})"

        cells = (self.shape, show(self.capacity), show(self.cap_per_rank), show(self.host_pool))
        return " | ".join((*cells, show(self.refused)))


def compare(pair: Pair, judged: Judged) -> Row:
    running = judged.by_name[pair.running.name]
    after = judged.by_name[pair.changed.name]
    server = kvpilot_server(pair.running, running)
    change = Change.of(server, pair.change)
    option = judge_change(server, pair.change)
    refused = (option.verdict == "unsafe", not after["accepted"])
    reasons = tuple(option.reasons)
    if pair.refused_by_sglang or not after["accepted"]:
        return Row(pair.name, refused=refused, kvpilot_reasons=reasons)
    row = Row(pair.name, refused=refused, kvpilot_reasons=reasons)
    row.capacity = (change.tokens, sglang_capacity(after))
    row.cap_per_rank = (change.running_cap_per_rank, int(after["max_running_requests_per_dp"]))
    if after.get("host_pool"):
        row.host_pool = (host_pool_tokens(change), int(after["host_pool"]["tokens"]))
    return row


def test_kvpilot_predicts_what_sglang_configures(judged: Judged) -> None:
    rows = [compare(p, judged) for p in PAIRS]
    print("\nshape | capacity kvpilot / SGLang | per-rank cap | host pool | refused")
    for row in rows:
        print(row.line())
    wrong = [r.line() for r in rows if any(e > TOLERANCE for e in r.errors())]
    refusals = [r.line() for r in rows if not r.refusals_agree]
    expected = [(p.name, p.refused_by_sglang) for p in PAIRS]
    assert [(r.shape, bool(r.refused and r.refused[1])) for r in rows] == expected
    assert not wrong, "\n".join(wrong)
    assert not refusals, "\n".join(refusals)


def test_the_grid_of_gpus_and_fractions(judged: Judged) -> None:
    rows = [compare(p, judged) for p in GRID]
    worst = max(e for r in rows for e in r.errors())
    floor = sum(1 for r in rows if r.refused == (True, False))
    print(
        f"\n{len(rows)} grid pairs, worst error {worst:.3%}; {floor} refused by kvpilot for the "
        f"activation floor only; judge {judged.timing}"
    )
    for row in rows:
        assert not any(e > TOLERANCE for e in row.errors()), row.line()
        assert row.refusals_agree, row.line()


def test_sglangs_default_reserve_is_kvpilots(judged: Judged) -> None:
    lines = []
    for s in DEFAULTS:
        result = judged.by_name[s.name]
        info = parse_server_info(result["server_info"])
        geometry = geometry_of(MODELS[s.model])
        reserve = sglang_reserve(deployment_of(info, s.gpu_mib, (0, 5, 23), geometry))
        assert result["accepted"], result
        real_fraction = float(result["resolved"]["mem_fraction_static"])
        rule = reserve.rule_mib or reserve.total_mib  # SGLang's `reserved_mem`, before a VLM's cut
        lines.append(
            f"{s.name}: reserve {rule:,.0f} / {result['reserved_mib']:,.0f} MiB (image encoder "
            f"{reserve.total_mib - rule:,.0f}), "
            f"fraction {reserve.default_fraction(s.gpu_mib)} / {real_fraction}, "
            f"attn DP {attn_dp_size(info)}"
        )
        assert rule == pytest.approx(result["reserved_mib"], abs=1), lines[-1]
        assert reserve.default_fraction(s.gpu_mib) == pytest.approx(real_fraction, abs=1e-9)
    print("\n" + "\n".join(lines))
