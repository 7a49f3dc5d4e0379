"""`--max-num-active-seqs`: the requests vLLM's scheduler admits into RUNNING when set, below
`--max-num-seqs`, which then only sizes the runner and its CUDA graphs (vllm/config/
scheduler.py `max_num_active_seqs`, "Must be <= max_num_seqs"; v1/core/sched/scheduler.py takes
it as `max_num_running_reqs`). A batch held at it is capped by it, and doubling max_num_seqs
would lift nothing."""

from __future__ import annotations

from playbooks.engines.vllm.allow_list import launch_settings
from playbooks.engines.vllm.bottleneck import analyse
from playbooks.engines.vllm.client import from_server_info
from playbooks.engines.vllm.facts import Context, seq_cap_total
from playbooks.engines.vllm.proposals import propose
from tests.playbooks.engines.vllm.test_rules import gpu_rules, measurement


def at_the_active_cap() -> Context:
    m = measurement(
        running=64, queued=40, queued_max=50, queue_nonempty_fraction=1.0, token_usage=0.4
    )
    return gpu_rules(max_num_seqs=256, max_num_active_seqs=64).context(m)


def test_the_active_cap_is_the_servers_cap() -> None:
    rules = gpu_rules(max_num_seqs=256, max_num_active_seqs=64, engines=2)
    assert seq_cap_total(rules.info) == 128
    assert seq_cap_total(gpu_rules(max_num_seqs=256, engines=2).info) == 512


def test_a_batch_at_the_active_cap_is_named_for_it_and_max_num_seqs_is_not_proposed() -> None:
    ctx = at_the_active_cap()
    bottleneck, evidence = analyse(ctx)
    said = " ".join(evidence)
    assert bottleneck == "compute" and "max_num_active_seqs (64)" in said, evidence
    options = propose(ctx, bottleneck)
    assert not [o for o in options if "max_num_seqs" in o.change], [o.change for o in options]
    assert "raise --max-num-active-seqs" in said, evidence


def test_the_active_cap_is_read_from_the_launch_and_vllms_report() -> None:
    args = ["--model", "m", "--max-num-seqs", "256", "--max-num-active-seqs", "64"]
    assert launch_settings(args)["max_num_active_seqs"] == 64
    report = {"vllm_config": {"scheduler_config": {"max_num_active_seqs": 64}}}
    assert from_server_info(report)["max_num_active_seqs"] == 64
