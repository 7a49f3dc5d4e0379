"""Which ranks label the scheduler's gauges, as SGLang 0.5.23's metrics collector decides."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankLabels:
    """Which TP ranks report each scheduler's gauges, and the label sets SGLang gives them.

    observability/metrics_collector.py::SchedulerMetricsCollectorContext.init_new: a scheduler
    reports when its attention-TP rank is 0, or on every TP rank with
    `--enable-metrics-for-all-schedulers`; `dp_rank` is a label only when there is more than one
    scheduler, `priority` (empty for the totals) only with `--enable-priority-scheduling`.
    """

    tp_ranks: tuple[tuple[int, ...], ...] = ((0,),)  # per scheduler, the reporting TP ranks
    tp_per_ep_rank: int = 1  # TP ranks per MoE expert-parallel rank (tp_size // ep_size)
    priority: bool = False

    @staticmethod
    def of(
        tp: int, ep: int, attn_dp: int, replicas: int, all_schedulers: bool, priority: bool
    ) -> RankLabels:
        attn_tp = tp // attn_dp
        ranks = []
        for replica in range(replicas):
            del replica  # every replica numbers its TP ranks from 0
            for group in range(attn_dp):
                first = group * attn_tp
                ranks.append(tuple(range(first, first + (attn_tp if all_schedulers else 1))))
        return RankLabels(tuple(ranks), max(1, tp // max(1, ep)), priority)
