"""How SGLang 0.5.23's label sets combine into one Snapshot, family by family.

The exposition is written as SGLang writes it (`observability/metrics_collector.py`,
`SchedulerMetricsCollector.init_new`: model_name, engine_type, tp_rank, pp_rank, moe_ep_rank,
then priority="" with `--enable-priority-scheduling` and dp_rank under a DP controller; labels
sorted, as its multiprocess collector serves them), for layouts the CPU tier cannot start:
several TP ranks, DP attention, hybrid pools. The priority breakdown is also recorded from the
real server (`tests/fixtures/sglang/real-0.5.23-priority`, `record_priority.py`).
"""

from __future__ import annotations

import pytest

from playbooks.engines.base import Snapshot
from playbooks.engines.sglang import ENGINE
from playbooks.engines.sglang.client import parse_metrics
from playbooks.engines.sglang.metrics import binding_pool, binding_pool_of, per_dp_rank
from tests.paths import FIXTURES
from tests.playbooks.engines.sglang.exposition import exposition, series


def snap(*lines: str) -> Snapshot:
    # every case has the scheduler's heartbeat gauge, so a snapshot exists
    heartbeat = (
        ()
        if any("num_running_reqs" in x for x in lines)
        else (series("sglang:num_running_reqs", 0),)
    )
    return ENGINE.snapshot(parse_metrics(exposition(*lines, *heartbeat)))


RUN, QUEUE = "sglang:num_running_reqs", "sglang:num_queue_reqs"
CAP, USAGE = "sglang:max_total_num_tokens", "sglang:token_usage"
GEN, HIT = "sglang:gen_throughput", "sglang:cache_hit_rate"


def by_priority(name: str, values: dict[str, float]) -> list[str]:
    """A queue gauge as `_log_gauge_queue_count` writes it: priority -> value ("" the total)."""
    return [series(name, value, priority=priority) for priority, value in values.items()]


# (what, exposition lines, Snapshot field, value)
CASES = [
    (
        "priority scheduling: the total under priority='' beside its breakdown",
        by_priority(RUN, {"": 7, "0": 3, "5": 4}),
        "running",
        7.0,
    ),
    (
        "priority scheduling: requests without a priority counted under their own label",
        by_priority(QUEUE, {"": 10, "0": 2, "-9223372036854775808": 5, "5": 3}),
        "queued",
        10.0,
    ),
    (
        "every TP rank writes the constants: capacity is one pool's",
        [series(CAP, 100_000, tp_rank=rank, moe_ep_rank=rank) for rank in range(4)],
        "capacity_tokens",
        100_000,
    ),
    (
        "--enable-metrics-for-all-schedulers: every TP rank reports the same batch",
        [series(RUN, 6, tp_rank=0), series(RUN, 6, tp_rank=1)],
        "running",
        6.0,
    ),
    (
        "DP attention (tp 4, dp 2): running summed over DP ranks, logged by attn_tp_rank 0",
        [series(RUN, 3, dp_rank=0, tp_rank=0), series(RUN, 5, dp_rank=1, tp_rank=2)],
        "running",
        8.0,
    ),
    (
        "DP attention: capacity summed over DP ranks, not over their TP ranks",
        [
            series(CAP, 50_000, dp_rank=dp, tp_rank=tp)
            for dp, tp in ((0, 0), (0, 1), (1, 2), (1, 3))
        ],
        "capacity_tokens",
        100_000,
    ),
    (
        "DP attention with all schedulers and priorities: one total per DP rank",
        [
            series(QUEUE, q, dp_rank=dp, tp_rank=tp, priority=p)
            for dp, tp, p, q in (
                (0, 0, "", 4),
                (0, 0, "1", 4),
                (0, 1, "", 4),
                (1, 2, "", 6),
                (1, 2, "1", 6),
                (1, 3, "", 6),
            )
        ],
        "queued",
        10.0,
    ),
    (
        "DP ranks: usage is the mean share, not the sum",
        [
            series(USAGE, u, dp_rank=dp, tp_rank=tp)
            for dp, tp, u in ((0, 0, 0.4), (0, 1, 0.4), (1, 2, 0.8), (1, 3, 0.8))
        ],
        "kv_usage",
        pytest.approx(0.6),
    ),
    (
        "DP ranks: decode rates add up",
        [series(GEN, 900, dp_rank=0), series(GEN, 1100, dp_rank=1)],
        "decode_rate",
        2000.0,
    ),
    (
        "DP ranks: cache hit rate is a mean",
        [series(HIT, 0.2, dp_rank=0), series(HIT, 0.6, dp_rank=1)],
        "cache_hit_rate",
        pytest.approx(0.4),
    ),
    (
        "tokenizer counters: priority is each request's own, so every series counts",
        [
            'sglang:num_requests_total{is_streaming="false",priority=""} 4',
            'sglang:num_requests_total{is_streaming="false",priority="1"} 6',
            'sglang:num_requests_total{is_streaming="true",priority="1"} 1',
        ],
        "completed_requests",
        11.0,
    ),
    (
        "hybrid SWA: the pools' own shares beside the fullest",
        [
            series(USAGE, 0.93),
            series("sglang:full_token_usage", 0.41),
            series("sglang:swa_token_usage", 0.93),
            series("sglang:mamba_usage", 0.0),
        ],
        "swa_usage",
        pytest.approx(0.93),
    ),
    (
        "hybrid SWA: the full-attention pool's share",
        [series("sglang:full_token_usage", 0.41)],
        "full_usage",
        pytest.approx(0.41),
    ),
    (
        "hybrid mamba: the state pool's share",
        [
            series("sglang:mamba_usage", 0.88, dp_rank=0),
            series("sglang:mamba_usage", 0.9, dp_rank=1),
        ],
        "mamba_usage",
        pytest.approx(0.89),
    ),
    (
        "hybrid SWA: the sliding-window pool's size, once per DP rank",
        [
            series("sglang:max_total_num_tokens_swa", 8_000, dp_rank=dp, tp_rank=tp)
            for dp, tp in ((0, 0), (0, 1), (1, 2), (1, 3))
        ],
        "swa_capacity_tokens",
        16_000,
    ),
    (
        "no sliding window: SGLang writes no SWA size",
        [series(CAP, 30_000)],
        "swa_capacity_tokens",
        None,
    ),
]


@pytest.mark.parametrize(("what", "lines", "field", "want"), CASES, ids=[c[0] for c in CASES])
def test_label_sets_combine_the_way_sglang_means_them(
    what: str, lines: list[str], field: str, want: object
) -> None:
    assert getattr(snap(*lines), field) == want, what


def test_per_dp_rank_names_each_rank_once() -> None:
    text = exposition(
        *(series(CAP, 50_000, dp_rank=dp, tp_rank=tp) for dp, tp in ((0, 0), (0, 1), (1, 2)))
    )
    m = parse_metrics(text)
    assert per_dp_rank(CAP, m.labelled(CAP)) == {"0": 50_000, "1": 50_000}
    single = parse_metrics(exposition(series(CAP, 9, tp_rank=0), series(CAP, 9, tp_rank=1)))
    assert per_dp_rank(CAP, single.labelled(CAP)) == {"": 9}


PRIORITY_FIXTURE = FIXTURES / "sglang" / "real-0.5.23-priority"


@pytest.mark.parametrize("n", [1, 2])
def test_the_real_servers_priority_breakdown_is_not_counted_twice(n: int) -> None:
    m = parse_metrics((PRIORITY_FIXTURE / f"metrics_{n}.txt").read_text())
    for name, field in ((RUN, "running"), (QUEUE, "queued")):
        values = m.labelled(name)
        total = [v.value for v in values if v.labels["priority"] == ""]
        breakdown = [v.value for v in values if v.labels["priority"] != ""]
        # what the recording shows: one total, and per-priority series that add up to it
        assert len(total) == 1 and len(breakdown) >= 2 and sum(breakdown) == total[0] > 0
        assert getattr(ENGINE.snapshot(m), field) == total[0]
    assert ENGINE.snapshot(m).capacity_tokens == 20_000


# (full, swa, mamba) -> the pool that binds
POOLS = [
    ((0.95, 0.0, 0.0), "full"),
    ((0.40, 0.93, 0.0), "swa"),
    ((0.30, 0.0, 0.97), "mamba"),
    ((0.60, 0.70, 0.0), None),  # none near the top: no pool binds yet
    ((0.90, 0.90, 0.0), "full"),  # a tie names the pool every model has
    ((None, 0.92, None), "swa"),
    ((None, None, None), None),
]


@pytest.mark.parametrize(("usages", "pool"), POOLS)
def test_the_binding_pool(
    usages: tuple[float | None, float | None, float | None], pool: str | None
) -> None:
    assert binding_pool(*usages) == pool


def test_the_binding_pool_of_a_reading() -> None:
    hybrid = snap(
        series(USAGE, 0.93),
        series("sglang:full_token_usage", 0.41),
        series("sglang:swa_token_usage", 0.93),
        series("sglang:mamba_usage", 0.0),
    )
    assert binding_pool_of(hybrid) == "swa"
    assert binding_pool_of(Snapshot()) is None
