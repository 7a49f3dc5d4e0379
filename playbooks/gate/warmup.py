"""How much of the trial to drop as warm-up after the restart (MSER-5, floor and ceiling).

Right after a restart the decode rate ramps up and caches fill; judging those seconds would
charge the change for the restart. MSER (White 1997) finds where the series settles; a cut at its
ceiling means the rate is still settling, and the gate waits instead of judging a transient.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from playbooks.engines.base import Snapshot
from playbooks.gate.settings import GateSettings
from playbooks.stats.batch_means import scrape_spacing


def mser_truncation(values: Sequence[float], group: int = 5, max_fraction: float = 0.5) -> int:
    """MSER-m: how many leading values to drop (a multiple of `group`, at most `max_fraction`).

    The series is averaged in groups of `group`; the cut d minimises
    sum_{i>d}(Y_i - mean_d)^2 / (n - d)^2 over d <= max_fraction * n.
    """
    return _mser(values, group, max_fraction)[0]


def _mser(values: Sequence[float], group: int, max_fraction: float) -> tuple[int, bool]:
    """(MSER cut in values, whether it sits at the ceiling: the transient may still be going)."""
    groups = [
        statistics.fmean(values[i : i + group]) for i in range(0, len(values) - group + 1, group)
    ]
    n = len(groups)
    if n < 2:
        return 0, False
    ceiling = int(n * max_fraction)
    best_d, best = 0, math.inf
    for d in range(ceiling + 1):
        tail = groups[d:]
        if len(tail) < 2:
            break
        m = statistics.fmean(tail)
        score = sum((y - m) ** 2 for y in tail) / len(tail) ** 2
        if score < best - 1e-12 * abs(best if math.isfinite(best) else 1.0):
            best_d, best = d, score
    return best_d * group, 0 < best_d == ceiling


def warmup_cut(
    trial: Sequence[Snapshot], settings: GateSettings, floor_s: float | None = None
) -> float:
    """Seconds after the restart to drop: MSER on the decode rate, floor and ceiling."""
    return warmup(trial, settings, floor_s)[0]


def warmup(
    trial: Sequence[Snapshot], settings: GateSettings, floor_s: float | None = None
) -> tuple[float, bool]:
    """(seconds after the restart to drop, whether the warm-up is over).

    MSER-5 picks the cut; it is never less than the floor and never more than half the trial.
    When MSER's best cut is that ceiling, the decode rate may still be settling (a long ramp, a
    cache filling): the warm-up is not over, and the gate waits instead of judging a transient.
    """
    if not trial:
        return 0.0, False
    t0 = trial[0].t - scrape_spacing(trial)  # the restart: one scrape interval before the first
    series = [(s.t, s.decode_rate) for s in trial if s.decode_rate is not None]
    floor = settings.warmup_floor_s if floor_s is None else floor_s
    span = trial[-1].t - t0
    ceiling = settings.warmup_max_fraction * span
    cut, at_ceiling = 0.0, False
    if len(series) >= 2 * settings.mser_group:
        k, at_ceiling = _mser(
            [v for _, v in series], settings.mser_group, settings.warmup_max_fraction
        )
        cut = series[k - 1][0] - t0 if k > 0 else 0.0
    over = not at_ceiling
    return min(max(cut, floor), max(ceiling, floor)), over
