"""A server that answers but generates nothing is diagnosed as such, not by its frozen rate."""

from __future__ import annotations

import signal
import time

import pytest

from playbooks.diagnose.playbook import _stalled
from playbooks.engines.base import Assessment
from playbooks.engines.types import Option
from tests.playbooks.diagnose.test_diagnose_twin import SCALE, diagnose_json
from tests.playbooks.engines.sglang.test_rules import measurement
from tests.twin_process import running_twin

KV_BOUND = Assessment(
    bottleneck="kv_cache",
    evidence=["the KV cache is full"],
    options=[
        Option(
            "mem_fraction_static=0.88",
            {"mem_fraction_static": 0.88},
            "recommended",
            160_000,
            (0.2, 0.4),
            "",
            [],
        )
    ],
    bytes_per_token=70_272,
    gpu_memory_gib=95.3,
    gpu_memory_source="config",
    requests_that_fit=50,
    notes=["a note of the rules"],
)


def test_a_stalled_server_gets_its_evidence_and_no_change() -> None:
    a = _stalled(KV_BOUND, measurement(), 120.0)
    assert a.bottleneck == "stalled" and a.options == []
    assert a.evidence == [
        "the server is not generating: none of its readings moved for 120 s while 50 requests "
        "were running and 100 waiting, and it did not answer a one-token request; it still "
        "answers its readiness probe, and the decode rate it reports is the last one its "
        "engine logged"
    ]
    assert "hung GPU or collective" in a.notes[0] and a.notes[1:] == KV_BOUND.notes


@pytest.mark.slow
def test_the_stuck_twin_is_diagnosed_as_not_generating() -> None:
    args = ["--time-scale", SCALE, "--enable-metrics", "--mem-fraction-static", "0.85"]
    args += ["--workload", "incident", "--concurrency", "150", "--sglang-version", "0.5.23"]
    with running_twin(args) as twin:
        time.sleep(1.0)  # the load reaches the server
        twin.proc.send_signal(signal.SIGUSR1)
        data = diagnose_json(twin.url, "--window", "300")
    assert data["bottleneck"] == "stalled", data["evidence"]
    assert data["options"] == []
    assert "the server is not generating" in data["evidence"][0]
