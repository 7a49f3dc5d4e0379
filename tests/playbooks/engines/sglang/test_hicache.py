"""HiCache, table-style: version gates read from each release's server info, the combinations
SGLang refuses (in its words), what else enabling it changes, and the container's memory."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from playbooks.engines.sglang.client import parse_server_info
from playbooks.engines.sglang.deployment import parse_version
from playbooks.engines.sglang.facts import Server
from playbooks.engines.sglang.geometry import geometry_of
from playbooks.engines.sglang.hicache import HostPoolCheck, host_pool_tokens, refusals, side_effects
from playbooks.engines.sglang.proposals import hicache_proposal
from playbooks.engines.sglang.proposed_change import Change, Finding
from playbooks.sources.host import GIB, HostMemory
from tests.paths import FIXTURES
from tests.playbooks.engines.sglang.test_geometry import DSA
from tests.playbooks.engines.sglang.test_rules import context

# version: (per-rank host budget, smaller host pool only warns, container limit, startup_available)
GATES = {
    "twin-0.5.5/get_server_info": (False, False, False, False),
    "twin-0.5.10/server_info": (False, False, False, False),
    "shape-0.5.14/server_info": (False, False, False, False),
    "shape-0.5.15/server_info": (False, True, False, False),
    "shape-0.5.18/server_info": (False, True, False, True),
    "shape-0.5.19/server_info": (True, True, False, True),
    "shape-0.5.20/server_info": (True, True, False, True),
    "shape-0.5.21/server_info": (True, True, True, True),
    "real-0.5.23/server_info": (True, True, True, True),
}


@pytest.mark.parametrize(("fixture", "expected"), GATES.items(), ids=list(GATES))
def test_version_gates_from_each_release_s_server_info(
    fixture: str, expected: tuple[bool, bool, bool, bool]
) -> None:
    info = parse_server_info(json.loads((FIXTURES / "sglang" / f"{fixture}.json").read_text()))
    server = Server(info, context().cap, None, 8, parse_version(info.version))
    gates = (server.per_rank_checked, server.host_pool_may_be_smaller)
    assert (*gates, server.container_limit_checked) == expected[:3]
    assert (info.memory.startup_available_gb is not None) is expected[3]
    assert info.memory.graph_gb is not None  # one figure, or the sum over phases from 0.5.17


def hicache_safety(
    change: dict[str, Any], version: str, host: HostMemory | None = None, **args: Any
) -> Finding:
    server = context(version=version, **args).server
    if host is not None:
        server = replace(server, host=host)
    proposed = Change.of(server, {"enable_hierarchical_cache": True, **change})
    check = HostPoolCheck()
    return check.safety(proposed, check.value(proposed))


SMALL = {"hicache_size": 5}  # under the GPU pool's 7.6 GB per rank
BIG = {"hicache_size": 30}  # 8 ranks x 30 GB = 240 GB, over 256 GiB less reserve and margin
# change, version, verdict, words in the reasons
POOL = [
    (SMALL, "0.5.14", "unsafe", "must be larger than the GPU pool"),
    (SMALL, "0.5.15", None, "SGLang only warns"),
    (SMALL, "0.5.18", None, "SGLang only warns"),
    (BIG, "0.5.18", "unsafe", "checks each rank against the whole host"),
    (BIG, "0.5.19", "unsafe", "refuses to start (it splits the host budget per rank)"),
    (BIG, "0.5.23", "unsafe", "refuses to start (it splits the host budget per rank)"),
]


@pytest.mark.parametrize(("change", "version", "verdict", "words"), POOL)
def test_the_host_pool_is_judged_by_what_that_release_checks(
    change: dict[str, Any], version: str, verdict: str | None, words: str
) -> None:
    found = hicache_safety(change, version)
    assert found.verdict == verdict
    assert words in " ".join(found.reasons)


CONTAINER = HostMemory(64 * GIB, 48 * GIB, "test, bounded by memory.max", container_limited=True)
# version, words: a pool that fits the host's 256 GiB but not a 48 GiB container
CONTAINERS = [
    ("0.5.20", "not the container's limit"),
    ("0.5.21", "refuses to start"),
]


@pytest.mark.parametrize(("version", "words"), CONTAINERS)
def test_the_budget_is_the_container_s_not_the_host_s(version: str, words: str) -> None:
    found = hicache_safety({"hicache_size": 10}, version, CONTAINER)
    assert found.verdict == "unsafe"
    assert "the container may use 64 GiB" in found.reasons[0]
    assert words in found.reasons[1]


# settings on top of the incident server, version, SGLang's words in the refusal
REFUSED = [
    ({"disable_radix_cache": True}, "0.5.5", "mutually exclusive and cannot be used"),
    ({"disable_radix_cache": True}, "0.5.23", "mutually exclusive and cannot be used"),
    ({"enable_lmcache": True}, "0.5.21", "--enable-lmcache and --enable-hierarchical-cache"),
    (
        {"kv_cache_dtype": "nvfp4", "attention_backend": "trtllm_mha"},
        "0.5.23",
        "SM100 native NVFP4 with trtllm_mha",
    ),
    ({"dcp_size": 2, "attention_backend": "dsa"}, "0.5.23", "DSA DCP does not support"),
    ({"dcp_size": 2, "speculative_algorithm": "EAGLE"}, "0.5.18", "only supports DSPARK"),
    ({"enable_int8_mamba_checkpoint": True}, "0.5.14", "not int8-aware"),
    ({"hicache_host_memory_mode": "buffer_only"}, "0.5.19", "requires a storage backend"),
]


@pytest.mark.parametrize(("settings", "version", "words"), REFUSED)
def test_impossible_combinations_are_refused_in_sglang_s_words(
    settings: dict[str, Any], version: str, words: str
) -> None:
    found = hicache_safety(settings, version)
    assert found.verdict == "unsafe"
    assert words in found.reasons[0]
    assert "refuses to start" in found.reasons[0] and "Fix:" in found.reasons[0]


# settings, version: what is not refused (the rule's version range or its condition)
NOT_REFUSED = [
    ({"enable_lmcache": True}, "0.5.20"),
    ({"kv_cache_dtype": "nvfp4", "attention_backend": "flashinfer"}, "0.5.23"),
    ({"dcp_size": 2, "speculative_algorithm": "DSPARK"}, "0.5.23"),
    ({"dcp_size": 2, "speculative_algorithm": "EAGLE"}, "0.5.17"),
    ({"enable_int8_mamba_checkpoint": True}, "0.5.13"),
    ({"hicache_host_memory_mode": "buffer_only", "hicache_storage_backend": "file"}, "0.5.23"),
]


@pytest.mark.parametrize(("settings", "version"), NOT_REFUSED)
def test_combinations_outside_a_refusal_pass(settings: dict[str, Any], version: str) -> None:
    assert refusals(parse_version(version), settings) == []


# settings, version, the risks enabling HiCache brings (beside the decode overhead)
EFFECTS = [
    ({"page_size": 64}, "0.5.5", {"decode attention backend changes"}),
    ({"page_size": 64, "hicache_io_backend": "direct"}, "0.5.5", set()),
    (
        {"page_size": 64, "attention_backend": "fa3"},
        "0.5.10",
        {"decode attention backend changes", "no piecewise CUDA graphs"},
    ),
    ({"page_size": 64, "attention_backend": "flashinfer"}, "0.5.10", {"no piecewise CUDA graphs"}),
    ({"page_size": 64, "disable_piecewise_cuda_graph": True}, "0.5.18", set()),
    ({"page_size": 64}, "0.5.19", set()),
    ({"page_size": 16}, "0.5.23", {"small pages"}),
    (
        {"page_size": 64, "model_path": "stepfun-ai/Step-3.5-Flash"},
        "0.5.23",
        {"fewer KV tokens (hybrid SWA pool off)"},
    ),
    (
        {"page_size": 64, "model_path": "XiaomiMiMo/MiMo-V2-Flash"},
        "0.5.20",
        {"fewer KV tokens (hybrid SWA pool off)"},
    ),
    ({"page_size": 64, "model_path": "XiaomiMiMo/MiMo-V2-Flash"}, "0.5.21", set()),
]


@pytest.mark.parametrize(("settings", "version", "risks"), EFFECTS)
def test_side_effects_of_enabling_hicache(
    settings: dict[str, Any], version: str, risks: set[str]
) -> None:
    assert {rule.risk for rule in side_effects(parse_version(version), settings)} == risks


def test_side_effects_reach_the_finding_and_the_decode_overhead_is_always_a_risk() -> None:
    found = hicache_safety({"hicache_size": 20, "attention_backend": "fa3"}, "0.5.10")
    assert found.verdict is None
    assert "decode attention backend changes" in found.risks
    assert any(r.startswith("per-step decode overhead") for r in found.risks)
    assert any("_resolve_io_decode_attention_compatibility" in r for r in found.reasons)


def test_a_server_with_hicache_on_is_not_told_its_side_effects_again() -> None:
    found = hicache_safety({"hicache_size": 20}, "0.5.10", enable_hierarchical_cache=True)
    assert found.risks == ()


def host_of(gib: float) -> HostMemory:
    return HostMemory(int(gib * GIB), int(gib * GIB), "test")


# SGLang 0.5.21 on: with neither --hicache-ratio nor --hicache-size, the default ratio 2 is
# reduced until the host pools fit 0.8 of the host's free memory after a 10 GiB reserve, split
# over the host's ranks, less 5% slack (mem_cache/hicache_auto_size.py `auto_size_hicache`;
# --hicache-host-memory-fraction 0.8, arg_groups/fields/memory.py). The incident's 8 ranks hold
# 7.6 GiB of KV each: ratio 2 wants 8 x 15.2 GiB, more than a 96 GiB host gives.
# change, version, host GiB, verdict, words
AUTO = [
    ({}, "0.5.20", 96, "unsafe", "refuses to start"),
    ({}, "0.5.21", 96, None, "SGLang 0.5.21 sizes the host pool to fit"),
    ({}, "0.5.23", 96, None, "ratio 2 -> 1.07"),
    ({}, "0.5.23", 9, "unsafe", "No host memory is left for HiCache"),
    ({"hicache_ratio": 2}, "0.5.23", 96, "unsafe", "refuses to start"),
    ({"hicache_size": 40}, "0.5.23", 96, "unsafe", "refuses to start"),
]


@pytest.mark.parametrize(("change", "version", "host_gib", "verdict", "words"), AUTO)
def test_the_hierarchical_cache_alone_is_sized_by_sglang_from_0_5_21(
    change: dict[str, Any], version: str, host_gib: float, verdict: str | None, words: str
) -> None:
    found = hicache_safety(change, version, host_of(host_gib))
    assert found.verdict == verdict, found.reasons
    assert words in " ".join(found.reasons), found.reasons


def test_an_auto_sized_pool_is_predicted_in_tokens_as_sglang_sizes_it() -> None:
    server = replace(context(version="0.5.23").server, host=host_of(96))
    proposed = Change.of(server, {"enable_hierarchical_cache": True})
    per_rank = proposed.tokens // proposed.ranks
    tokens = host_pool_tokens(proposed)
    assert tokens == pytest.approx(per_rank * 1.0753, rel=0.01)


# From 0.5.19 each rank checks an explicit pool against the host memory free *when it starts*,
# after the ranks before it pinned theirs, divided by all ranks (pool_host/base.py
# `host_memory_budget_bytes`; sglang#38156). The last of r ranks sees F - (r-1) x S, so a size
# above (F - 10 GiB) / (2r - 1) a rank can be refused there: at TP8 on the incident's 256 GiB
# host that is 16.4 GiB (17.6 GB), where the per-rank split alone allows 30.75 GiB.
# change, version, verdict, words
RACE = [
    ({"hicache_size": 16}, "0.5.23", None, "fits"),
    ({"hicache_size": 20}, "0.5.23", "possible", "sglang#38156"),
    ({"hicache_size": 20}, "0.5.19", "possible", "intermittently"),
    ({"hicache_size": 20}, "0.5.18", None, "fits"),  # checked against the whole host
]


@pytest.mark.parametrize(("change", "version", "verdict", "words"), RACE)
def test_an_explicit_pool_the_last_rank_may_be_refused_is_only_possible(
    change: dict[str, Any], version: str, verdict: str | None, words: str
) -> None:
    found = hicache_safety(change, version)
    assert found.verdict == verdict, found.reasons
    assert words in " ".join(found.reasons + found.risks), found.reasons


def test_the_proposed_pool_is_one_every_rank_accepts() -> None:
    # a 128 GiB host: the split allows 13.3 GiB a rank with kvpilot's margin, the last rank
    # 7.9 GiB (8.4 GB; 7.6 GB with the margin)
    option = hicache_proposal(context(version="0.5.23", host_gib=128), "kv_cache")
    assert option is not None
    assert option.change["hicache_size"] == 7, option.change
    older = hicache_proposal(context(version="0.5.18", host_gib=128), "kv_cache")
    assert older is not None
    assert older.change["hicache_size"] == 14, older.change


def as_dsa(version: str, host_gib: float) -> Any:
    """The incident's context with DeepSeek-V3.2's geometry: MLA plus the indexer's 128-dim
    FP8 keys and their scales, 132 bytes a token a layer, 8,052 over 61 layers (12% of the
    65,420-byte cell)."""
    ctx = context(version=version, host_gib=host_gib)
    return replace(ctx, cap=replace(ctx.cap, geometry=geometry_of(DSA)))


def test_a_dsa_model_pins_its_indexer_keys_beside_the_kv_host_pool() -> None:
    """SGLang sizes a DSA model's indexer host pool outside --hicache-size, as many tokens as
    the KV one, and checks it against the host memory left after that pool (pool_host/dsa.py).
    A size that fits as KV alone is refused with it; the proposal leaves room for both."""
    text = hicache_proposal(context(version="0.5.18", host_gib=128), "kv_cache")
    dsa = as_dsa("0.5.18", 128)
    option = hicache_proposal(dsa, "kv_cache")
    assert text is not None and option is not None
    assert option.change["hicache_size"] < text.change["hicache_size"] == 14
    server = dsa.server
    check = HostPoolCheck()
    for size, verdict in ((option.change["hicache_size"], None), (14, "unsafe")):
        change = Change.of(server, {"enable_hierarchical_cache": True, "hicache_size": size})
        found = check.safety(change, check.value(change))
        assert found.verdict == verdict, found.reasons
        assert "GB of DSA indexer keys, a host pool SGLang sizes outside" in found.reasons[0]
