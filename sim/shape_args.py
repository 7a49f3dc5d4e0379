"""The server arguments of the deployment shapes (`sim.shapes`), as `sim.args` resolves them."""

from __future__ import annotations

import argparse
from typing import Any

from sim.presets import Preset
from sim.shapes import (
    DEFAULT_SWA_FULL_TOKENS_RATIO,
    SPEC_DEFAULT_MAX_RUNNING_REQUESTS,
    Layout,
    Speculation,
    resolve_speculation,
)


def max_running_arg(ns: argparse.Namespace, spec: Speculation | None) -> int | None:
    """speculative_hook.py::_handle_eagle_family sets 48 when speculation is on and none given."""
    if ns.max_running_requests is None and spec is not None:
        return SPEC_DEFAULT_MAX_RUNNING_REQUESTS
    return ns.max_running_requests  # type: ignore[no-any-return]


def shape_args(
    ns: argparse.Namespace, spec: Speculation | None, layout: Layout, refactored: bool
) -> dict[str, Any]:
    """The deployment-shape arguments: attention DP, speculation, SWA, priorities, metrics."""
    out: dict[str, Any] = {
        "load_balance_method": "round_robin"
        if ns.load_balance_method == "auto"
        else ns.load_balance_method,
        "speculative_algorithm": spec.algorithm if spec else None,
        "speculative_draft_model_path": ns.speculative_draft_model_path,
        "speculative_num_steps": spec.num_steps if spec else None,
        "speculative_eagle_topk": spec.eagle_topk if spec else None,
        "speculative_num_draft_tokens": spec.num_draft_tokens if spec else None,
        "swa_full_tokens_ratio": swa_ratio(ns),
        "enable_priority_scheduling": ns.enable_priority_scheduling,
        "default_priority_value": ns.default_priority_value,
        "enable_metrics_for_all_schedulers": ns.enable_metrics_for_all_schedulers,
    }
    if refactored:
        out["attn_dp_size"] = layout.attn_dp
    return out


def swa_ratio(ns: argparse.Namespace) -> float:
    ratio = ns.swa_full_tokens_ratio
    return DEFAULT_SWA_FULL_TOKENS_RATIO if ratio is None else float(ratio)


def speculation(
    parser: argparse.ArgumentParser, ns: argparse.Namespace, preset: Preset
) -> Speculation | None:
    try:
        return resolve_speculation(
            ns.speculative_algorithm,
            preset.model.architecture,
            preset.model.nextn_layers,
            ns.speculative_draft_model_path,
            ns.speculative_num_steps,
            ns.speculative_eagle_topk,
            ns.speculative_num_draft_tokens,
        )
    except ValueError as exc:
        parser.error(f"argument --speculative-algorithm: {exc}")
