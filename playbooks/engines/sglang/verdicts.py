"""SGLang's verdict on a change: its checks (`argument_checks.py`), the throughput a larger pool may
buy, and the option's title and static GPU memory; the walk is `playbooks.engines.kit.verdicts`.
"""

from __future__ import annotations

from playbooks.engines.findings import (
    NOTHING_AGAINST,
    RESTART_RISK,
    BatchLimits,
    kv_capacity_gain,
    worst,
)
from playbooks.engines.kit.checks import Observed
from playbooks.engines.kit.verdicts import Verdicts
from playbooks.engines.sglang.argument_checks import checks_for
from playbooks.engines.sglang.hicache import HostPoolCheck, host_pool_tokens
from playbooks.engines.sglang.host_tier import host_tier_gain
from playbooks.engines.sglang.proposed_change import Change
from playbooks.engines.timebudget import Traffic

__all__ = ["NOTHING_AGAINST", "RESTART_RISK", "evaluate", "judge_change", "worst"]
# The hierarchical cache is switched on with its size: the title names the size alone.
IMPLIED = frozenset({"enable_hierarchical_cache"})


def capacity_gain(
    change: Change, seen: Observed, limits: BatchLimits | None
) -> tuple[float, float] | None:
    """Throughput change from more KV room (`kv_capacity_gain`), or from a host tier switched
    on alone (`host_tier`), where it can be predicted."""
    if turns_on_host_tier(change):
        return host_tier_gain(
            seen.m.time_budget, seen.m.cached_fraction, change.per_scheduler,
            host_pool_tokens(change),
        )  # fmt: skip
    if limits is None:
        return None
    return kv_capacity_gain(
        limits, seen.kv_bound, seen.m.time_budget,
        change.bytes_per_token / change.cap.bytes_per_token, traffic_of(change, seen),
    )  # fmt: skip


def turns_on_host_tier(change: Change) -> bool:
    """The change switches the hierarchical cache on and changes nothing but its settings."""
    return (
        change.hicache
        and not change.server.hicache_on
        and set(change.values) <= set(HostPoolCheck.names)
    )


def traffic_of(change: Change, seen: Observed) -> Traffic | None:
    """What a decode step reads per GPU today: the weights SGLang reports and the pool's
    share in use over the window. Only for a model its config.json shows dense: an MoE step
    reads more experts as its batch grows, so its weights are no fixed cost, and where the
    config is out of reach kvpilot cannot tell which it is. None otherwise, or where the
    weights or the usage are unknown."""
    cap, usage = change.cap, seen.m.token_usage
    dense = cap.geometry is not None and cap.geometry.routed_experts == 0
    if not dense or cap.weights_gib is None or usage is None:
        return None
    return Traffic(cap.weights_gib, usage * cap.kv_gib)


def static_gpu_gib(change: Change) -> float | None:
    """GPU memory per GPU the change adds to the pool and the cache's buffers (what stays
    outside them shrinks by as much); None where it adds nothing."""
    cap = change.cap
    extra = cap.outside_now_gib - cap.outside_gib(
        change.fraction, change.bytes_per_token, change.hicache
    )
    return round(extra, 3) if extra > 0 else None


VERDICTS = Verdicts(Change.of, checks_for, capacity_gain, IMPLIED, static_gpu_gib)
evaluate = VERDICTS.evaluate
judge_change = VERDICTS.judge
