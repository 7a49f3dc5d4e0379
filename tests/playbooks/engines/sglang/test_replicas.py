"""`--dp-size N` without attention DP: N replicas of the whole model behind SGLang's DP
controller, each a scheduler with its own KV pool and the whole `--max-running-requests`.

SGLang 0.5.23: the controller reports the first replica's `max_total_num_tokens`
(`managers/data_parallel_controller.py`, `_record_scheduler_init_infos`), divides the request
cap only by the attention-DP size (`mem_cache/kv_cache_configurator.py`,
`resolve_max_num_reqs`: `max_num_reqs // self.attn_dp_size`), and refuses replicas combined with
attention DP (`arg_groups/parallel_hook.py`). The metrics sum running requests over `dp_rank`.
Read as one replica, two replicas running 120 of 200 each looked "at max_running_requests
(200)" and kvpilot proposed 400."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from playbooks.engines.sglang.bottleneck import analyse
from playbooks.engines.sglang.deployment import dp_replicas
from playbooks.engines.sglang.facts import pool_tokens, running_cap_total
from playbooks.engines.sglang.proposals import propose
from tests.playbooks.engines.sglang.test_rules import by_title, context, info, measurement

POOL = 116_171  # one replica's, as /server_info reports it


@pytest.mark.parametrize(
    ("args", "replicas"),
    [
        ({"dp_size": 2}, 2),
        ({"dp_size": 2, "enable_dp_attention": True}, 1),  # the old spelling of attention DP
        ({"attn_dp_size": 4, "dp_size": 1}, 1),  # 0.5.23's resolved attention DP
        ({"dp_size": 1}, 1),
        ({}, 1),
    ],
)
def test_replicas_are_dp_size_without_attention_dp(args: dict[str, Any], replicas: int) -> None:
    assert dp_replicas(info(**args)) == replicas


def replicas_context(running: float, queued: float = 0.0, usage: float = 0.6) -> object:
    ctx = context(
        measurement(
            running=running,
            queued=queued,
            queued_max=queued,
            queue_nonempty_fraction=1.0 if queued else 0.0,
            token_usage=usage,
        ),
        dp_size=2,
        tp_size=4,
        max_running_requests=200,
    )
    return replace(ctx, info=replace(ctx.info, effective_max_running_requests=200))


def test_the_pool_and_the_request_cap_count_every_replica() -> None:
    ctx = replicas_context(240)
    assert pool_tokens(ctx.info) == 2 * POOL  # type: ignore[attr-defined]
    assert running_cap_total(ctx.info) == 400  # type: ignore[attr-defined]


def test_two_replicas_below_their_caps_are_not_called_capped() -> None:
    ctx = replicas_context(240, queued=50)
    bottleneck, evidence = analyse(ctx)  # type: ignore[arg-type]
    assert bottleneck != "compute" or not any("max_running_requests" in e for e in evidence), (
        bottleneck,
        evidence,
    )
    opts = by_title(propose(ctx, bottleneck))  # type: ignore[arg-type]
    assert "max_running_requests=400" not in opts, list(opts)


def test_replicas_at_their_caps_are_capped_at_the_whole_servers_400() -> None:
    ctx = replicas_context(400, queued=50, usage=0.5)
    bottleneck, evidence = analyse(ctx)  # type: ignore[arg-type]
    said = " ".join(evidence)
    assert bottleneck == "compute" and "max_running_requests (400)" in said, evidence
    assert "2 --dp-size replicas of 116,171" in said, evidence
    # the flag is each replica's own: twice the whole server's 400 is 400 on each
    opts = by_title(propose(ctx, bottleneck))  # type: ignore[arg-type]
    (larger,) = [o for o in opts.values() if "max_running_requests" in o.change]
    assert larger.change["max_running_requests"] == 400, larger.change
