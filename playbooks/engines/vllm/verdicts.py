"""vLLM's verdict on a change: its checks (`argument_checks.py`), the throughput a larger pool may
buy and the option's title; the walk is `playbooks.engines.kit.verdicts`.
"""

from __future__ import annotations

from playbooks.engines.findings import BatchLimits, kv_capacity_gain
from playbooks.engines.kit.checks import Observed
from playbooks.engines.kit.verdicts import Verdicts
from playbooks.engines.vllm.argument_checks import checks_for
from playbooks.engines.vllm.proposed_change import Change


def capacity_gain(
    change: Change, seen: Observed, limits: BatchLimits | None
) -> tuple[float, float] | None:
    """Throughput change from more KV room (`kv_capacity_gain`), where it can be predicted."""
    return None if limits is None else kv_capacity_gain(limits, seen.kv_bound)


VERDICTS = Verdicts(Change.of, checks_for, capacity_gain)
evaluate = VERDICTS.evaluate
judge_change = VERDICTS.judge
