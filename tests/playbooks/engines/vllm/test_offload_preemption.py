"""vLLM's KV offloading as insurance against preemption. A preempted request is computed again
from the start (v1/core/sched/scheduler.py `_preempt_request`: `num_computed_tokens = 0`); with
the offloading connector its stored blocks are flushed to the CPU when it is preempted
(distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py `build_connector_meta`:
"Flush jobs for preempted requests") and found again when it returns
(`get_num_new_matched_tokens`), so for a server that preempts often it may pay without any
prefix reuse. Whether it does is a measurement: the verdict is possible, never recommended."""

from __future__ import annotations

from playbooks.engines.vllm.proposals import propose
from playbooks.engines.vllm.verdicts import evaluate
from tests.playbooks.engines.vllm.test_rules import context, measurement

PREEMPTING = {"token_usage": 0.97, "retractions": 300, "cached_fraction": 0.0}


def offload_option(**over: object) -> object:
    ctx = context(measurement(**{**PREEMPTING, **over}))
    options = [o for o in propose(ctx, "kv_cache") if "kv_offloading_size" in o.change]
    assert len(options) == 1, [o.change for o in propose(ctx, "kv_cache")]
    return options[0]


def test_a_server_that_preempts_often_hears_of_offloading() -> None:
    option = offload_option()
    assert option.verdict == "possible", option.reasons  # type: ignore[attr-defined]
    said = " ".join(option.reasons)  # type: ignore[attr-defined]
    assert "preempted" in said and "flushed to the CPU" in said, said


def test_without_preemption_or_reuse_it_is_not_proposed_and_not_useful() -> None:
    ctx = context(measurement(**{**PREEMPTING, "retractions": 0}))
    assert not [o for o in propose(ctx, "kv_cache") if "kv_offloading_size" in o.change]
    asked = evaluate({"kv_offloading_size": 40.0}, ctx, "kv_cache", considered=True)
    assert asked.verdict == "not_useful", asked.reasons
