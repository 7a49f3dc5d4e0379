"""The verdict chart: generation throughput over the experiment, before and after the change.

Rates come from the same counter the gate uses (completed requests' output tokens), averaged
over the gate's batch length so the picture matches what was tested; the gate's estimates
are drawn as lines with their 95% bands.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from playbooks.engines import restore_snapshot
from storage.samples import Sample

COLOURS = {"baseline": "#4C72B0", "warmup": "#BBBBBB", "trial": "#DD8452", "monitor": "#999999"}


def batch_rates(samples: Sequence[Sample], batch_s: float) -> list[tuple[str, float, float]]:
    """(phase, middle time, tokens/s) per batch of `batch_s` within each phase."""
    out: list[tuple[str, float, float]] = []
    by_phase: dict[str, list[tuple[float, float]]] = {}
    for s in samples:
        tokens = restore_snapshot(s.metrics).generated_tokens
        if tokens is not None:
            by_phase.setdefault(s.phase, []).append((s.t, tokens))
    for phase, rows in by_phase.items():
        start = rows[0]
        for row in rows[1:]:
            span = row[0] - start[0]
            if span >= batch_s:
                tokens = row[1] - start[1]
                if tokens >= 0:
                    out.append((phase, (row[0] + start[0]) / 2, tokens / span))
                start = row
    return sorted(out, key=lambda r: r[1])


def verdict_chart(samples: Sequence[Sample], result: dict[str, Any], *, title: str) -> bytes:
    t0 = min(s.t for s in samples)
    batch_s = max(10.0, (samples[-1].t - t0) / 60)
    rates = batch_rates(samples, batch_s)
    fig, ax = plt.subplots(figsize=(8, 3.6), dpi=100)
    try:
        for phase in ("baseline", "warmup", "trial", "monitor"):
            pts = [(t, r) for p, t, r in rates if p == phase]
            if pts:
                ax.plot(
                    [(t - t0) / 60 for t, _ in pts],
                    [r for _, r in pts],
                    marker="o",
                    markersize=3,
                    linewidth=1,
                    color=COLOURS[phase],
                    label=phase,
                )
        for key in ("baseline", "trial"):
            est = result.get(key) or {}
            if est.get("mean") is None:
                continue
            phase_t = [(s.t - t0) / 60 for s in samples if s.phase == key]
            if not phase_t:
                continue
            lo_t, hi_t = min(phase_t), max(phase_t)
            ax.hlines(est["mean"], lo_t, hi_t, colors=COLOURS[key], linestyles="--", linewidth=2)
            if est.get("ci95"):
                ax.fill_between(
                    [lo_t, hi_t], est["ci95"][0], est["ci95"][1], color=COLOURS[key], alpha=0.15
                )
        effect = (result.get("effect") or {}).get("mean")
        verdict = result.get("verdict", "")
        suffix = f": {verdict}" if verdict else ""
        if effect is not None:
            suffix += f" ({effect:+.1%})"
        ax.set_title(title + suffix, fontsize=10)
        ax.set_xlabel("minutes since the experiment started")
        ax.set_ylabel("generated tokens/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        if rates:
            ax.legend(loc="lower right", fontsize=8)
        buf = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buf, format="png")
        return buf.getvalue()
    finally:
        plt.close(fig)
