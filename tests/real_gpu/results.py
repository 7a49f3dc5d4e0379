"""What a GPU call's phases found, put side by side (pure), and the text table of a call.

    python3 -m tests.real_gpu.results DIR [DIR ...]   # the table of one or more calls' $OUT

Each phase writes one JSON file; this module reads them back, so an A/B whose two sides ran in
two calls (`ab-a.json`, `ab-b.json`) is compared here, and the capacity predictions of every
started server are held against the capacity each fraction really got.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

# At most 8 files come back from a call, flat: these, in this order.
OUT_FILES = (
    "run.json",
    "results.txt",
    "smoke.json",
    "capacity.json",
    "experiment-clear.json",  # or experiment.json (any change)
    "oom-probe.json",
    "ab.json",  # or ab-a.json / ab-b.json, one side per call
    "jit-cache.tar.xz",
    "logs.tar.xz",
)
OUT_LIMIT = 8


def ab_file(side: str) -> str:
    return "ab.json" if side == "both" else f"ab-{side}.json"


# --------------------------------------------------------------------------------- capacity


def capacity_rows(servers: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (started server, other fraction it predicted): kvpilot's predictions with
    each set of probes against the capacity that fraction really got (None if not started)."""
    real = {
        _key(s["fraction"]): s["max_total_num_tokens"]
        for s in servers
        if s.get("max_total_num_tokens") is not None
    }
    rows: list[dict[str, Any]] = []
    for s in servers:
        preds = s.get("predictions") or {}
        targets = sorted(
            {
                t
                for label in ("server", "nvml")
                for t in (preds.get(label) or {}).get("targets", {})
            },
            key=float,
        )
        for target in targets:
            row: dict[str, Any] = {"from": s["fraction"], "to": float(target)}
            row["real"] = real.get(_key(float(target)))
            for label in ("server", "nvml"):
                got = ((preds.get(label) or {}).get("targets") or {}).get(target) or {}
                tokens = got.get("predicted_max_total_num_tokens")
                row[label] = tokens
                row[f"{label}_error"] = relative(tokens, row["real"])
                row[f"{label}_verdict"] = got.get("verdict")
            rows.append(row)
    return rows


def _key(fraction: float) -> str:
    return f"{float(fraction):g}"


def relative(predicted: float | None, real: float | None) -> float | None:
    if predicted is None or not real:
        return None
    return round(predicted / real - 1, 5)


# ---------------------------------------------------------------------------------------- A/B


def window(samples: Sequence[Mapping[str, Any]], t0: float, t1: float) -> list[Mapping[str, Any]]:
    return [s for s in samples if t0 <= s["t"] <= t1]


def decode_rate(samples: Sequence[Mapping[str, Any]]) -> tuple[float | None, str]:
    """Tokens/s decoded over the samples: from the decode counter's growth where SGLang exports
    it (every step counted), else the mean of its throughput gauge."""
    counted = [s for s in samples if s.get("decoded_tokens") is not None]
    if len(counted) >= 2 and counted[-1]["t"] > counted[0]["t"]:
        grown = counted[-1]["decoded_tokens"] - counted[0]["decoded_tokens"]
        return grown / (counted[-1]["t"] - counted[0]["t"]), "realtime_tokens_total{mode=decode}"
    gauges = [s["decode_rate"] for s in samples if s.get("decode_rate") is not None]
    if gauges:
        return statistics.fmean(gauges), "gen_throughput (mean)"
    return None, "none"


BATCH_S = 15.0  # the gate's batch: three readings 5 s apart
Z95 = 1.96


def batch_rates(samples: Sequence[Mapping[str, Any]], batch_s: float = BATCH_S) -> list[float]:
    """The decode counter's rate over consecutive batches of about `batch_s` seconds: the
    nearly independent pieces a window's interval is made from (batch means)."""
    counted = [s for s in samples if s.get("decoded_tokens") is not None]
    rates: list[float] = []
    if not counted:
        return rates
    start = counted[0]
    for s in counted[1:]:
        if s["t"] - start["t"] >= 0.9 * batch_s:
            rates.append((s["decoded_tokens"] - start["decoded_tokens"]) / (s["t"] - start["t"]))
            start = s
    return rates


def rate_spread(rates: Sequence[float]) -> dict[str, float] | None:
    """Mean, its standard error, and each half's mean (a window still settling shows it)."""
    if len(rates) < 4:
        return None
    half = len(rates) // 2
    return {
        "mean": round(statistics.fmean(rates), 1),
        "se": round(statistics.stdev(rates) / len(rates) ** 0.5, 2),
        "first_half": round(statistics.fmean(rates[:half]), 1),
        "second_half": round(statistics.fmean(rates[half:]), 1),
        "batches": len(rates),
    }


def relative_interval(
    a: Mapping[str, float] | None, b: Mapping[str, float] | None
) -> tuple[float, float, float] | None:
    """B against A over their batch means: the relative difference and its 95% interval (the
    ratio's standard error by the delta method)."""
    if a is None or b is None or not a["mean"]:
        return None
    r = b["mean"] / a["mean"]
    se = r * ((a["se"] / a["mean"]) ** 2 + (b["se"] / b["mean"]) ** 2) ** 0.5
    return round(r - 1, 4), round(r - 1 - Z95 * se, 4), round(r - 1 + Z95 * se, 4)


def client_rate(
    finished: Iterable[Sequence[float]], started_at: float, t0: float, t1: float
) -> tuple[float, int]:
    """Output tokens per second of the requests that finished inside [t0, t1] (wall clock),
    from the load generator's timeline, and how many finished."""
    inside = [tokens for at, tokens in finished if t0 <= started_at + at <= t1]
    return (sum(inside) / (t1 - t0) if t1 > t0 else 0.0), len(inside)


def side_summary(side: Mapping[str, Any]) -> dict[str, Any]:
    """One configuration's steady window: decode rate, load, retractions, client rate."""
    t0, t1 = side["window"]
    samples = window(side["samples"], t0, t1)
    rate, source = decode_rate(samples)

    def mean(key: str) -> float | None:
        values = [s[key] for s in samples if s.get(key) is not None]
        return round(statistics.fmean(values), 2) if values else None

    pre = [s["preemptions"] for s in samples if s.get("preemptions") is not None]
    load = side.get("load") or {}
    tokens_s, done = client_rate(load.get("finished", []), load.get("started_at", 0.0), t0, t1)
    return {
        "fraction": side["fraction"],
        "extra": side.get("extra", []),
        "gpu": (side.get("gpu") or {}).get("name"),
        "window_s": round(t1 - t0, 1),
        "samples": len(samples),
        "decode_tokens_per_s": None if rate is None else round(rate, 1),
        "decode_source": source,
        "decode_batches": rate_spread(batch_rates(samples)),
        "running": mean("running"),
        "queued": mean("queued"),
        "kv_usage": mean("kv_usage"),
        "retractions": (pre[-1] - pre[0]) if len(pre) >= 2 else None,
        "client_tokens_per_s": round(tokens_s, 1),
        "client_requests": done,
        "max_total_num_tokens": side.get("max_total_num_tokens"),
    }


def compare(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """B against A, relative, for the rates; and whether both ran on the same kind of GPU."""
    out: dict[str, Any] = {"same_gpu": a.get("gpu") == b.get("gpu")}
    for key in ("decode_tokens_per_s", "client_tokens_per_s"):
        out[key] = relative(b.get(key), a.get(key))
    out["decode_interval"] = relative_interval(a.get("decode_batches"), b.get("decode_batches"))
    return out


def ab_sides(found: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The A/B's sides from `ab.json`, or from `ab-a.json` and `ab-b.json` of two calls."""
    sides: dict[str, Any] = {}
    for name in ("ab.json", "ab-a.json", "ab-b.json"):
        sides.update((found.get(name) or {}).get("sides", {}))
    return sides


# ------------------------------------------------------------------------------------ table


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _cell(tokens: float | None, error: float | None) -> str:
    if tokens is None:
        return "-"
    return _num(tokens) + ("" if error is None else f" ({_pct(error)})")


def render(found: Mapping[str, Mapping[str, Any]]) -> str:
    """The text table of whatever phases were found (file name -> its JSON)."""
    parts: list[str] = []
    run = found.get("run.json")
    if run:
        parts.append(
            f"GPU call: {(run.get('gpu') or {}).get('name', '?')}; phases "
            + ", ".join(f"{p['phase']} {p['status']} ({p['seconds']:.0f} s)" for p in run["ran"])
            + "".join(f"; {p} skipped: {why}" for p, why in run.get("skipped", []))
        )
    smoke = found.get("smoke.json")
    if smoke and "server" not in smoke:
        parts.append(f"smoke: {smoke['status']}: {smoke.get('error', 'no server info')}")
    elif smoke:
        s = smoke.get("server", {})
        parts.append(
            f"smoke: {smoke['status']}; SGLang {s.get('version')} started in "
            f"{_num(s.get('startup_s'))} s at {s.get('fraction')}; max_total_num_tokens "
            f"{_num(s.get('max_total_num_tokens'))}; {len(smoke.get('requests', []))} requests; "
            f"{len(smoke.get('metric_families', []))} sglang: metric families"
        )
    capacity = found.get("capacity.json")
    if capacity:
        parts.append(capacity_table(capacity.get("servers", [])))
    for name in ("experiment-clear", "experiment"):
        exp = found.get(f"{name}.json")
        if exp:
            parts.append(
                f"{name}: {exp.get('change')} exit {exp.get('exit_status')}, "
                f"{exp.get('state')}: {exp.get('reason')}; final mem_fraction_static "
                f"{exp.get('final_fraction')}, {exp.get('final_value')}"
            )
    probe = found.get("oom-probe.json")
    if probe:
        parts.append(probe_table(probe))
    sides = ab_sides(found)
    if sides:
        parts.append(ab_table(sides))
    return "\n\n".join(parts) + "\n"


def probe_table(probe: Mapping[str, Any]) -> str:
    """One line per probed fraction: what happened under the long load, and kvpilot's word."""
    lines = [
        f"oom-probe: {probe.get('clients')} clients, {probe.get('profile')}, "
        f"{probe.get('probe_s')} s each",
        "fraction | verdict | max_total_num_tokens | peak GPU GiB | peak token usage | "
        "completed | errors | prefill graph dropped",
    ]
    for p in probe.get("probes", []):
        peak = p.get("peak") or {}
        load = p.get("load") or {}
        dropped = "Disabling auto-selected prefill CUDA graph" in (p.get("degraded") or {})
        lines.append(
            f"{p.get('fraction')} | {p.get('verdict', p.get('status'))} | "
            f"{_num(p.get('max_total_num_tokens'))} | {peak.get('gpu_used_gib')} | "
            f"{peak.get('sglang:token_usage')} | {load.get('completed')} | "
            f"{load.get('errors')} | {'yes' if dropped else 'no'}"
        )
    return "\n".join(lines)


def capacity_table(servers: Sequence[Mapping[str, Any]]) -> str:
    lines = [
        "capacity: max_total_num_tokens at each fraction, and kvpilot's prediction of it from "
        "each started server (probes: none / NVML)",
        f"{'fraction':>8} {'real':>9} {'start s':>8} {'SGLang free':>11} {'kvpilot free':>12}",
    ]
    for s in servers:
        model = ((s.get("predictions") or {}).get("server") or {}).get("model") or {}
        lines.append(
            f"{s['fraction']:>8g} {_num(s.get('max_total_num_tokens')):>9} "
            f"{_num(s.get('startup_s')):>8} {s.get('sglang_pre_load_gib') or '-':>11} "
            f"{model.get('gpu_memory_before_load_gib', '-'):>12}"
        )
    lines.append(f"{'from':>6} {'to':>5} {'real':>9} {'server-only':>20} {'with NVML':>20}")
    for r in capacity_rows(servers):
        lines.append(
            f"{r['from']:>6g} {r['to']:>5g} {_num(r['real']):>9} "
            f"{_cell(r['server'], r['server_error']):>20} {_cell(r['nvml'], r['nvml_error']):>20}"
        )
    return "\n".join(lines)


def ab_table(sides: Mapping[str, Mapping[str, Any]]) -> str:
    summaries = {name: side_summary(side) for name, side in sorted(sides.items())}
    lines = [
        "A/B: the steady window of each configuration under the same load",
        f"{'side':4} {'fraction':>8} {'decode tok/s':>12} {'running':>8} {'queued':>7} "
        f"{'retract':>7} {'client tok/s':>12} {'window s':>8}  gpu",
    ]
    for name, s in summaries.items():
        extra = " " + " ".join(s["extra"]) if s["extra"] else ""
        lines.append(
            f"{name:4} {s['fraction']:>8g} {_num(s['decode_tokens_per_s']):>12} "
            f"{s['running'] if s['running'] is not None else '-':>8} "
            f"{s['queued'] if s['queued'] is not None else '-':>7} "
            f"{_num(s['retractions']):>7} {_num(s['client_tokens_per_s']):>12} "
            f"{s['window_s']:>8g}  {s['gpu']}{extra}"
        )
    if "a" in summaries and "b" in summaries:
        c = compare(summaries["a"], summaries["b"])
        ci = c["decode_interval"]
        lines.append(
            f"B against A: decode {_pct(c['decode_tokens_per_s'])}"
            + (f" (95% {_pct(ci[1])} .. {_pct(ci[2])} over 15 s batches)" if ci else "")
            + f", client {_pct(c['client_tokens_per_s'])}"
            + ("" if c["same_gpu"] else "  (WARNING: the sides ran on different GPUs)")
        )
    return "\n".join(lines)


def load_dirs(dirs: Iterable[Path]) -> dict[str, dict[str, Any]]:
    """Every phase file found in `dirs`; a later folder's file wins over an earlier one's."""
    found: dict[str, dict[str, Any]] = {}
    for folder in dirs:
        for path in sorted(folder.glob("*.json")):
            found[path.name] = json.loads(path.read_text())
    return found


def main(argv: list[str] | None = None) -> int:
    dirs = [Path(a) for a in (sys.argv[1:] if argv is None else argv)]
    if not dirs or not all(d.is_dir() for d in dirs):
        print(
            "usage: python3 -m tests.real_gpu.results DIR [DIR ...] (folders of a GPU call's "
            "files)",
            file=sys.stderr,
        )
        return 2
    print(render(load_dirs(dirs)), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
