"""vLLM on a GPU it shares: a utilization the GPU cannot give at start-up is refused before the
restart. vLLM asks for `ceil(total * utilization)` of free memory when it starts and raises
"Free memory on device ... on startup is less than desired GPU memory utilization" otherwise
(v1/worker/utils.py `request_memory`; `tests/real_vllm/test_start_judge.py` holds the rule to
vLLM's own function). Once the server restarts, its own budget is free again, so what it can ask
for is today's utilization plus what NVML sees free now, on the GPUs it runs on."""

from __future__ import annotations

from typing import Any

import pytest

from playbooks.engines import engine_named
from playbooks.engines.types import DiagnoseSettings
from playbooks.engines.vllm.client import parse_settings
from playbooks.engines.vllm.proposals import propose
from playbooks.engines.vllm.rules import rules_for
from playbooks.engines.vllm.shared_gpu import start_limit
from playbooks.sources.gpu import FakeGpuReader, GpuState
from tests.playbooks.engines.vllm.test_rules import Llama8b, gpu_server, measurement

GIB = 1 << 30
TOTAL = 80 * GIB


def gpu(index: int, used_gib: float) -> GpuState:
    used = int(used_gib * GIB)
    return GpuState(index, "NVIDIA H100 80GB HBM3", f"GPU-{index}", TOTAL, used, TOTAL - used, 0, 0)


def judged(target: float, gpus: list[GpuState], **args: Any) -> Any:
    engine = engine_named("vllm")
    probes = DiagnoseSettings(gpus=FakeGpuReader(gpus), models=Llama8b())
    rules = engine.rules_for(parse_settings(gpu_server(**args)), probes)
    return rules.judge(engine.parse_change([f"gpu_memory_utilization={target:g}"]))


# (GPUs' used GiB, server's arguments, target) -> verdict; the server at 0.80 holds its 64 GiB
# budget and a CUDA context of about 0.4 GiB on an 80 GiB GPU: 64.4 GiB used when alone.
AT_080: dict[str, Any] = {"gpu_memory_utilization": 0.80}
TP2: dict[str, Any] = {**AT_080, "tensor_parallel_size": 2}
CASES: list[tuple[str, list[float], dict[str, Any], float, str]] = [
    ("alone: what is free now is its to take", [64.4], AT_080, 0.90, "_starts"),
    ("another process holds 10 GiB: 0.90 cannot start", [74.4], AT_080, 0.90, "unsafe"),
    ("another process holds 10 GiB: 0.85 still starts", [74.4], AT_080, 0.85, "_starts"),
    ("another process holds 1.5 GiB", [65.9], AT_080, 0.90, "_starts"),
    ("an idle GPU beside it is not its GPU", [74.4, 0.5], AT_080, 0.90, "unsafe"),
    ("TP2: the fuller of its two GPUs binds", [64.4, 74.4], TP2, 0.90, "unsafe"),
    ("TP2 on three candidate GPUs, one shared", [64.4, 64.4, 74.4], TP2, 0.90, "possible"),
]


@pytest.mark.parametrize(
    ("name", "used", "args", "target", "verdict"), CASES, ids=[c[0] for c in CASES]
)
def test_start_up_on_a_shared_gpu(
    name: str, used: list[float], args: dict[str, Any], target: float, verdict: str
) -> None:
    option = judged(target, [gpu(i, u) for i, u in enumerate(used)], **args)
    said = " ".join([*option.reasons, option.risk])
    if verdict == "_starts":
        assert option.verdict != "unsafe" and "on startup" not in said, said
    else:
        assert option.verdict == verdict and "on startup" in said, (option.verdict, said)


def test_the_refusal_says_what_holds_the_gpu_and_the_highest_that_starts() -> None:
    option = judged(0.90, [gpu(0, 74.4)], **AT_080)
    text = " ".join(option.reasons)
    assert "vLLM refuses to start" in text and "10.4 GiB" in text, text
    assert "at most 0.87" in text, text


def test_the_limit_is_todays_utilization_plus_what_is_free() -> None:
    limit = start_limit(0.80, [gpu(0, 74.4)], ranks=1)
    assert limit is not None and limit.highest == pytest.approx(0.80 + 5.6 / 80)
    assert start_limit(0.80, [gpu(0, 0.5)], ranks=1) is None  # no GPU could hold the server


def test_a_kv_bound_server_on_a_shared_gpu_is_offered_what_starts_there() -> None:
    """Not 0.95, which would restart the server into vLLM's refusal: the highest that starts."""
    probes = DiagnoseSettings(gpus=FakeGpuReader([gpu(0, 74.4)]), models=Llama8b())
    rules = rules_for(parse_settings(gpu_server(**AT_080)), probes)
    opts = {o.title: o for o in propose(rules.context(measurement()), "kv_cache")}
    assert "gpu_memory_utilization=0.95" not in opts
    best = opts["gpu_memory_utilization=0.87"]
    assert best.verdict in ("recommended", "possible") and "on startup" not in best.risk
    alone = rules_for(
        parse_settings(gpu_server(**AT_080)),
        DiagnoseSettings(gpus=FakeGpuReader([gpu(0, 64.4)]), models=Llama8b()),
    )
    assert "gpu_memory_utilization=0.95" in {
        o.title for o in propose(alone.context(measurement()), "kv_cache")
    }
