"""kvpilot's own capacity predictions, from a running server, for other memory fractions.

The same call `kvpilot diagnose --consider mem_fraction_static=F` and `kvpilot experiment` make:
the engine's rules built from the server's settings and the probes (`rules_for`), then `judge`
on the change. Two sets of probes: none (a URL diagnosed from elsewhere, as the server reports
itself) and NVML (`local_gpus`, the bot on the GPU host). The capacity model behind them is
recorded too (its GPU memory before loading is where the first run's predictions went wrong).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from playbooks.engines import engine_named
from playbooks.engines.types import DiagnoseSettings
from playbooks.sources.gpu import GpuReader
from playbooks.sources.model_config import LocalModelConfigs


def predictions(url: str, fractions: Iterable[float], gpus: GpuReader | None) -> dict[str, Any]:
    """For each set of probes: kvpilot's capacity model and its verdict on each fraction."""
    engine = engine_named("sglang")
    client = engine.connect(url)
    try:
        info = client.settings()
    finally:
        client.close()
    own = info.settings.get("mem_fraction_static")
    probes: dict[str, GpuReader | None] = {"server": None}
    if gpus is not None:
        probes["nvml"] = gpus
    out: dict[str, Any] = {"capacity_tokens": info.capacity_tokens, "fraction": own}
    for label, reader in probes.items():
        settings = DiagnoseSettings(gpus=reader, models=LocalModelConfigs())
        rules = engine.rules_for(info, settings, measured=False)
        targets: dict[str, Any] = {}
        for f in fractions:
            if own is not None and abs(float(own) - f) < 1e-9:
                continue
            option = rules.judge(engine.parse_change([f"mem_fraction_static={f:g}"]))
            targets[f"{f:g}"] = {
                "predicted_max_total_num_tokens": option.predicted_max_total_num_tokens,
                "verdict": option.verdict,
                "reasons": option.reasons[:4],
            }
        out[label] = {"model": capacity_model(rules), "targets": targets}
    return out


def capacity_model(rules: Any) -> dict[str, Any] | None:
    """What SGLang's rules assumed (its `cap`), where the engine's rules expose one."""
    cap = getattr(rules, "cap", None)
    if cap is None:
        return None
    return {
        "gpu_memory_before_load_gib": round(cap.gpu.pre_gib, 3),
        "gpu_memory_source": cap.gpu.source,
        "gpu_memory_exact": cap.gpu.exact,
        "bytes_per_token": cap.bytes_per_token,
        "weights_gib": cap.weights_gib,
        "graph_gib": cap.graph_gib,
        "kv_gib": cap.kv_gib,
        "safe_max_fraction": round(cap.safe_max_fraction(), 4),
        "notes": list(getattr(rules, "notes", [])),
    }
