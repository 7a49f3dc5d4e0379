"""Prometheus exposition text as SGLang 0.5.23 writes it, for layouts the CPU tier cannot start.

Scheduler samples carry `SchedulerMetricsCollector.init_new`'s labels (model_name, engine_type,
tp_rank, pp_rank, moe_ep_rank; priority="" with `--enable-priority-scheduling`, dp_rank under a
DP controller), sorted as SGLang's multiprocess collector serves them.
"""

from __future__ import annotations

MODEL = "/models/m"


def series(name: str, value: float, **labels: str | int) -> str:
    """One scheduler sample with SGLang's base labels (ranks default to 0)."""
    full: dict[str, str | int] = {
        "engine_type": "unified",
        "model_name": MODEL,
        "moe_ep_rank": 0,
        "pp_rank": 0,
        "tp_rank": 0,
        **labels,
    }
    text = ",".join(f'{k}="{v}"' for k, v in sorted(full.items()))
    return f"{name}{{{text}}} {value}"


def exposition(*lines: str) -> str:
    """Prometheus text: a TYPE line per family, then its samples, as `generate_latest` writes."""
    families: dict[str, list[str]] = {}
    for line in lines:
        sample = line.split("{", 1)[0]
        family = sample.removesuffix("_total")
        families.setdefault(family, []).append(line)
    out = []
    for family, samples in families.items():
        kind = "counter" if samples[0].split("{", 1)[0].endswith("_total") else "gauge"
        out.append(f"# TYPE {family} {kind}")
        out.extend(samples)
    return "\n".join(out) + "\n"
