"""The vLLM twin's bulk histogram observation against prometheus_client's own `observe`."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram

from sim.vllm.metrics import observe_many


@pytest.mark.parametrize("value", [0.0, 0.004, 0.01, 0.3, 7.5, 1e9])
def test_observe_many_matches_repeated_observe(value: float) -> None:
    bounds = (0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 10.0)
    one_by_one, bulk = CollectorRegistry(), CollectorRegistry()
    a = Histogram("itl_seconds", "x", buckets=bounds, registry=one_by_one)
    b = Histogram("itl_seconds", "x", buckets=bounds, registry=bulk)
    for _ in range(37):
        a.observe(value)
    observe_many(b, value, 37)
    got = {s.name + str(s.labels): s.value for m in b.collect() for s in m.samples}
    want = {s.name + str(s.labels): s.value for m in a.collect() for s in m.samples}
    assert got.keys() == want.keys()
    for key, value_ in want.items():  # the sum differs from 37 additions in the last bits only
        assert got[key] == pytest.approx(value_, rel=1e-12), key
