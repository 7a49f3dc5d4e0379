"""The worked example of docs/playbooks.md: which fractions are recommended on the incident's
GPUs, which possible, which unsafe, from the server's own report (the twin's 0.5.10 reply)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from playbooks.engines.sglang.client import parse_server_info
from playbooks.engines.sglang.proposals import propose
from playbooks.engines.sglang.rules import ServerRules, rules_for
from playbooks.engines.sglang.verdicts import evaluate
from playbooks.engines.types import DiagnoseSettings
from tests.paths import FIXTURES
from tests.playbooks.engines.sglang.test_geometry import KIMI_K2
from tests.playbooks.engines.sglang.test_rules import measurement

INCIDENT = FIXTURES / "sglang" / "twin-0.5.10" / "server_info.json"

# fraction -> (KV tokens, GiB outside the pool, GiB for activations, verdict), as the docs say
TABLE = {
    0.89: (174_617, 10.51, 8.51, "possible"),
    0.90: (189_228, 9.56, 7.56, "possible"),
    0.92: (218_451, 7.65, 5.65, "possible"),
    0.93: (233_063, 6.69, 4.69, "unsafe"),
}


class KimiConfig:
    def read(self, model_path: str) -> dict[str, Any]:
        return KIMI_K2


@pytest.fixture
def rules() -> ServerRules:
    info = parse_server_info(json.loads(INCIDENT.read_text()))
    return rules_for(info, DiagnoseSettings(gpu_memory_gib=95.59, models=KimiConfig()))


@pytest.mark.parametrize("fraction", sorted(TABLE))
def test_the_incidents_fractions(rules: ServerRules, fraction: float) -> None:
    tokens, outside, room, verdict = TABLE[fraction]
    ctx = rules.context(measurement())
    option = evaluate({"mem_fraction_static": fraction}, ctx, "kv_cache")
    assert option.verdict == verdict, option.reasons
    assert option.predicted_max_total_num_tokens == tokens
    assert rules.cap.outside_gib(fraction) == pytest.approx(outside, abs=0.005)
    assert rules.cap.activation_room_gib(fraction) == pytest.approx(room, abs=0.005)
    # what the change takes per GPU from the room outside the pool (a campaign's room check)
    assert option.static_gpu_gib == pytest.approx(rules.cap.outside_now_gib - outside, abs=0.01)


def test_sglangs_own_reserve_for_the_incident(rules: ServerRules) -> None:
    # 0.5.10, MLA: 512 + 1.5 x 8192 + 2 x 512 + 8/8 x 1024 + 1536 (piecewise prefill graphs)
    # = 16,384 MiB, SGLang's default 0.833; its floor 10 GiB
    reserve = rules.cap.reserve
    assert reserve is not None
    assert reserve.total_mib == 16_384 and reserve.floor_gib == 10.0
    assert reserve.default_fraction(97_887) == 0.833
    assert rules.cap.recommended_max_fraction() == 0.83  # below today's 0.85
    # a 4,096-token chunk: 512 + 6,144 + 1,024 + 1,024 + 1,536 = 10,240 MiB, the floor
    smaller = rules.cap.reserve_with(4096)
    assert smaller is not None and smaller.total_mib == 10_240
    assert rules.cap.recommended_max_fraction(chunked_prefill_size=4096) == 0.89
    assert rules.cap.recommended_max_fraction(chunked_prefill_size=2048) == 0.89
    assert rules.cap.safe_max_fraction() == 0.92


def test_the_proposals_show_each_limit(rules: ServerRules) -> None:
    ctx = rules.context(measurement())
    titles = {o.title: o.verdict for o in propose(ctx, "kv_cache")}
    assert "mem_fraction_static=0.89" not in titles  # not recommended with today's chunk
    # the largest halving of the chunk that reaches SGLang's floor, with the fraction it allows
    assert titles["chunked_prefill_size=4096, mem_fraction_static=0.89"] == "recommended"
    assert titles["mem_fraction_static=0.92"] == "possible"
    assert titles["mem_fraction_static=0.93"] == "unsafe"
