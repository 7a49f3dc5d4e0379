"""Conformance: the scheduler gauges' label sets with `--enable-priority-scheduling`, twin and real.

One real SGLang 0.5.23 server on CPU (TP1, one scheduler): every scheduler gauge carries a
`priority` label ("" for the totals), the running and queue gauges add a series per priority
seen, and there is no `dp_rank` label with a single scheduler.
"""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conformance.test_twin_vs_real import REAL_ENV, TWIN_ARGS
from tests.ports import free_port
from tests.real_sglang.harness import RealSGLang, sglang_env_available
from tests.twin_process import running_twin

pytestmark = [
    pytest.mark.real_sglang,
    pytest.mark.skipif(not sglang_env_available(), reason="real SGLang environment not installed"),
]

PRIORITY = ["--enable-metrics", "--enable-priority-scheduling", "--max-total-tokens", "20000"]
GAUGES = ("sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage")


def _label_sets(url: str) -> dict[str, set[tuple[tuple[str, str], ...]]]:
    """Per compared gauge, its series' labels with the values that do not name a process."""
    for priority in (1, 2, None):  # None: the scheduler gives it the lowest priority
        body: dict[str, object] = {"text": "a b c", "sampling_params": {"max_new_tokens": 4}}
        if priority is not None:
            body["priority"] = priority
        httpx.post(url + "/generate", json=body, timeout=120)
    out: dict[str, set[tuple[tuple[str, str], ...]]] = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        if fam.name in GAUGES:
            out[fam.name] = {
                tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
                for s in fam.samples
            }
    return out


def test_priority_label_sets() -> None:
    with RealSGLang.start(free_port(), PRIORITY, REAL_ENV) as real:
        real_sets = _label_sets(real.url)
    with running_twin([*TWIN_ARGS, *PRIORITY]) as twin:
        twin_sets = _label_sets(twin.url)
    print("real:", real_sets)
    print("twin:", twin_sets)
    assert set(real_sets) == set(twin_sets) == set(GAUGES)
    for name in GAUGES:
        assert real_sets[name] == twin_sets[name], name
    assert all("dp_rank" not in dict(s) for sets in twin_sets.values() for s in sets)
