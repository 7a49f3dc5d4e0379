"""Both engines' inter-token latency histograms into `Snapshot.itl_buckets`, from real scrapes.

The recordings are the real SGLang 0.5.23 (tests/fixtures/sglang/real-0.5.23/) and the real
vLLM 0.32.0 (tests/fixtures/vllm/real-0.32.0/); a server that exports no such histogram reads
None, never an empty or zero histogram, and the value survives storage.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from playbooks.engines import restore_snapshot
from playbooks.engines.base import Snapshot
from playbooks.engines.sglang import ENGINE as SGLANG
from playbooks.engines.sglang.client import parse_metrics as parse_sglang
from playbooks.engines.vllm import ENGINE as VLLM
from playbooks.engines.vllm.client import parse_metrics as parse_vllm
from playbooks.stats.histograms import quantile_between
from tests import paths

SGLANG_REAL = paths.FIXTURES / "sglang" / "real-0.5.23"
VLLM_REAL = paths.FIXTURES / "vllm" / "real-0.32.0"


def sglang(name: str) -> Snapshot:
    return SGLANG.snapshot(parse_sglang((SGLANG_REAL / name).read_text()))


def vllm(name: str) -> Snapshot:
    return VLLM.snapshot(parse_vllm((VLLM_REAL / name).read_text()))


@pytest.mark.parametrize(
    ("read", "name", "bounds", "count"),
    [
        # SGLang: 0.002 .. 8 s and +Inf; one observation per output token
        (sglang, "metrics_2.txt", 24, 24940.0),
        # vLLM: 0.01 .. 80 s and +Inf
        (vllm, "metrics_loaded.txt", 20, 794.0),
        (vllm, "metrics_idle_start.txt", 20, 0.0),  # exported, nothing observed yet
    ],
)
def test_the_recorded_histogram_is_kept_in_order(
    read: Callable[[str], Snapshot], name: str, bounds: int, count: float
) -> None:
    snap = read(name)
    assert snap.itl_buckets is not None and len(snap.itl_buckets) == bounds
    les = [le for le, _ in snap.itl_buckets]
    assert les == sorted(les) and math.isinf(les[-1])
    assert snap.itl_buckets[-1][1] == count


def test_the_p99_between_two_real_sglang_scrapes() -> None:
    first, second = sglang("metrics_1.txt"), sglang("metrics_2.txt")
    p99 = quantile_between(first.itl_buckets, second.itl_buckets, 0.99)
    # every token between the scrapes came 2 .. 6 ms after the one before (CPU, tiny model)
    assert p99 is not None and 0.004 < p99 <= 0.006


SGLANG_WITHOUT_ITL = (
    "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 3\n"
    "# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs 0\n"
)
VLLM_BEFORE_0_11 = (
    "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 2\n"
    "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n"
    "# TYPE vllm:time_per_output_token_seconds histogram\n"
    'vllm:time_per_output_token_seconds_bucket{le="0.01"} 4\n'
    'vllm:time_per_output_token_seconds_bucket{le="0.025"} 9\n'
    'vllm:time_per_output_token_seconds_bucket{le="+Inf"} 10\n'
    "vllm:time_per_output_token_seconds_count 10\n"
    "vllm:time_per_output_token_seconds_sum 0.2\n"
)


@pytest.mark.parametrize(
    ("snap", "expected"),
    [
        (SGLANG.snapshot(parse_sglang(SGLANG_WITHOUT_ITL)), None),
        (
            VLLM.snapshot(parse_vllm(VLLM_BEFORE_0_11)),
            ((0.01, 4.0), (0.025, 9.0), (math.inf, 10.0)),
        ),
    ],
    ids=["sglang without the histogram", "vllm's name before 0.11"],
)
def test_absent_is_none_and_the_older_vllm_name_is_read(
    snap: Snapshot, expected: tuple[tuple[float, float], ...] | None
) -> None:
    assert snap.itl_buckets == expected


@pytest.mark.parametrize(
    "stored",
    [
        sglang("metrics_2.txt").to_json(),
        {**sglang("metrics_2.txt").to_json(), "itl_buckets": None},
        {k: v for k, v in sglang("metrics_2.txt").to_json().items() if k != "itl_buckets"},
    ],
    ids=["stored", "stored without a histogram", "stored before the field existed"],
)
def test_stored_samples_read_back(stored: dict[str, object]) -> None:
    back = restore_snapshot(stored)
    expected = stored.get("itl_buckets")
    if expected is None:
        assert back.itl_buckets is None
    else:
        assert back.itl_buckets == sglang("metrics_2.txt").itl_buckets
