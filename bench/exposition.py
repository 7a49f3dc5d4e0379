"""What reading one `/metrics` costs the bot: `prometheus_client`'s parser against kvpilot's.

    python -m bench.exposition [--repeat 200]

For the real SGLang 0.5.23's recorded `/metrics` (91 KB, 685 lines) and the real vLLM 0.32.0's
(51 KB under load), the CPU time (`time.process_time`, median of five batches of `--repeat`)
of turning the text into the engine's `Metrics`, two ways: the whole text through
`prometheus_client.parser` (what the engines did before `playbooks/engines/kit/exposition.py`),
and the engine's own `parse_metrics` now (only its families, only the latency buckets). At 500
servers every 15 s the difference is what the sampler saves each round.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from playbooks.engines.base import Metrics, MetricsSpec, WrongEngine
from playbooks.engines.kit import engine as kit
from playbooks.engines.sglang.client import parse_metrics as sglang_metrics
from playbooks.engines.sglang.series import SPEC as SGLANG
from playbooks.engines.vllm.client import parse_metrics as vllm_metrics
from playbooks.engines.vllm.metrics import SPEC as VLLM

FIXTURES = Path(__file__).resolve().parent.parent / "tests/fixtures"
CASES = [
    ("SGLang 0.5.23", FIXTURES / "sglang/real-0.5.23/metrics_2.txt", SGLANG, sglang_metrics),
    ("vLLM 0.32.0", FIXTURES / "vllm/real-0.32.0/metrics_loaded.txt", VLLM, vllm_metrics),
]


def whole_text(text: str, spec: MetricsSpec) -> Metrics:
    """The engines' reading before: every family parsed, the engine's kept, every bucket."""
    families = [f for f in kit.exposition(text, WrongEngine) if f.name.startswith(spec.prefix)]
    samples = ((s.name, s.labels, s.value) for f in families for s in f.samples)
    return Metrics.read(samples, (f.name for f in families), ttft_histogram=spec.ttft_histogram)


def cpu_ms(read: Callable[[], object], repeat: int) -> float:
    batches = []
    for _ in range(5):
        start = time.process_time()
        for _ in range(repeat):
            read()
        batches.append((time.process_time() - start) / repeat * 1000)
    return statistics.median(batches)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.exposition")
    p.add_argument("--repeat", type=int, default=200)
    ns = p.parse_args()
    print("engine, /metrics size: CPU per reading, prometheus_client -> kvpilot's reader")
    for label, path, spec, parse in CASES:
        text = path.read_text()
        before = cpu_ms(functools.partial(whole_text, text, spec), ns.repeat)
        after = cpu_ms(functools.partial(parse, text), ns.repeat)
        print(
            f"{label}, {len(text) / 1000:.0f} KB: {before:.2f} ms -> {after:.2f} ms "
            f"({before / after:.1f}x); at 250 such servers every 15 s: "
            f"{250 * before / 1000:.1f} s -> {250 * after / 1000:.1f} s of CPU a round"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
