"""The SGLang rules on deployment shapes beyond the incident: DP attention, capped pools,
speculative decoding, post-capture sizing, mamba hybrids, coupled defaults."""

from __future__ import annotations

from typing import Any

import pytest

from playbooks.engines.sglang.argument_checks import PrefillChunkCheck
from playbooks.engines.sglang.client import ServerInfo, parse_server_info
from playbooks.engines.sglang.deployment import attn_dp_size, decode_max_bs, deployment_of
from playbooks.engines.sglang.geometry import geometry_of
from playbooks.engines.sglang.hicache import HostPoolCheck
from playbooks.engines.sglang.proposals import propose
from playbooks.engines.sglang.proposed_change import Change
from playbooks.engines.sglang.reserve import sglang_reserve
from playbooks.engines.sglang.rules import ServerRules, rules_for
from playbooks.engines.sglang.verdicts import evaluate
from playbooks.engines.types import DiagnoseSettings
from playbooks.sources.gpu import FakeGpuReader, GpuState
from playbooks.sources.host import HostMemory
from tests.playbooks.engines.sglang.test_geometry import GPT_OSS, KIMI_K2, QWEN3_NEXT
from tests.playbooks.engines.sglang.test_rules import measurement

GIB = 1 << 30


class Configs:
    def __init__(self, config: dict[str, Any] | None) -> None:
        self.config = config

    def read(self, model_path: str) -> dict[str, Any] | None:
        return self.config


class Host:
    def memory(self) -> HostMemory:
        return HostMemory(512 * GIB, 500 * GIB, "test")


def reply(**over: Any) -> dict[str, Any]:
    """A 0.5.23 /server_info of an H200 server, as SGLang resolves it."""
    base: dict[str, Any] = {
        "version": "0.5.23",
        "model_path": "deepseek-ai/DeepSeek-V3",
        "tp_size": 8,
        "pp_size": 1,
        "attn_dp_size": 1,
        "mem_fraction_static": 0.85,
        "max_total_num_tokens": 595_912,
        "max_req_input_len": 163_834,
        "chunked_prefill_size": 8192,
        "max_prefill_tokens": 16384,
        "cuda_graph_max_bs_decode": 512,
        "kv_cache_dtype": "auto",
        "page_size": 1,
        "max_total_tokens": None,
        "max_running_requests": None,
        "schedule_conservativeness": 1.0,
        "internal_states": [
            {
                "memory_usage": {
                    "weight": 80.0,
                    "kvcache": 39.0,
                    "startup_available": 21.0,
                    "token_capacity": 595_912,
                    "graph": {"decode": 0.0},
                },
                "effective_max_running_requests_per_dp": 2048,
            }
        ],
    }
    states = over.pop("internal_states", None)
    base.update(over)
    if states is not None:
        base["internal_states"] = states
    return base


def rules(data: dict[str, Any], config: dict[str, Any] | None = KIMI_K2, **kw: Any) -> ServerRules:
    kw.setdefault("gpu_memory_gib", 140.0)
    settings = DiagnoseSettings(models=Configs(config), host=Host(), **kw)
    return rules_for(parse_server_info(data), settings)


def dp_reply(per_rank_cap: int = 16) -> dict[str, Any]:
    state = {
        "memory_usage": {"weight": 80.0, "kvcache": 39.0, "token_capacity": 595_912,
                         "startup_available": 21.0, "graph": {}},
        "effective_max_running_requests_per_dp": per_rank_cap,
    }  # fmt: skip
    return reply(attn_dp_size=8, enable_dp_attention=True, max_running_requests=128,
                 internal_states=[state] * 8)  # fmt: skip


def test_dp_attention_counts_every_rank() -> None:
    r = rules(dp_reply())
    info = r.info
    assert attn_dp_size(info) == 8
    m = measurement(running=128, queued=200, token_usage=0.05, retractions_seen_in_gauge=0)
    ctx = r.context(m)
    bottleneck = r.assess(m).bottleneck
    assert bottleneck == "compute"
    titles = {o.title: o for o in propose(ctx, bottleneck)}
    bigger = next(o for t, o in titles.items() if t.startswith("max_running_requests=256"))
    assert bigger.change["max_running_requests"] == 256  # twice 16 x 8, global
    assert bigger.change["mem_fraction_static"] == 0.85  # pinned: SGLang would re-derive it
    assert bigger.verdict == "possible"
    shrink = evaluate({"max_running_requests": 64}, ctx, bottleneck)
    assert shrink.verdict == "unsafe" and "8 per rank" in shrink.reasons[0]


def test_dp_attention_sizes_the_reserve_with_the_whole_chunk() -> None:
    info = parse_server_info(dp_reply() | {"chunked_prefill_size": 1024})
    reserve = sglang_reserve(deployment_of(info, 143771.0, (0, 5, 23), geometry_of(KIMI_K2)))
    assert reserve.total_mib == 34_816  # the judge's figure for this shape


def test_an_mla_server_is_offered_dp_attention() -> None:
    r = rules(reply())
    m = measurement(running=120, queued=300, token_usage=0.95)
    ctx = r.context(m)
    option = next(o for o in propose(ctx, "kv_cache") if "attn_dp_size" in o.change)
    assert option.change == {"attn_dp_size": 8, "mem_fraction_static": 0.85}
    assert option.verdict == "possible"
    assert option.predicted_max_total_num_tokens == 8 * 595_912
    assert any("whole latent on every rank" in reason for reason in option.reasons)
    odd = evaluate({"attn_dp_size": 3}, ctx, "kv_cache")
    assert odd.verdict == "unsafe" and "divisible" in odd.reasons[0]


def test_gqa_gets_no_dp_attention() -> None:
    llama = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "head_dim": 128}  # fmt: skip
    r = rules(reply(), config=llama)
    ctx = r.context(measurement())
    assert not [o for o in propose(ctx, "kv_cache") if "attn_dp_size" in o.change]
    assert evaluate({"attn_dp_size": 8}, ctx, "kv_cache").verdict == "not_useful"


@pytest.mark.parametrize("reported", [True, False], ids=["startup_available", "0.5.10"])
def test_a_capped_pool_at_the_running_fraction_is_not_called_unsafe(reported: bool) -> None:
    # Llama-3.1-8B on an H100 at SGLang's own default fraction, the pool capped by
    # --max-total-tokens: most of the static budget is free, and the server runs. Without
    # startup_available (0.5.10) GPU memory can only be estimated from the split, which a cap
    # makes far too small: (15 + 7.3) / 0.835 = 26.7 GiB, "4.40 GiB outside the pool".
    llama = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "head_dim": 128}  # fmt: skip
    usage: dict[str, Any] = {"weight": 15.0, "kvcache": 7.32, "token_capacity": 60_000,
                             "graph": {"decode": 1.1}}  # fmt: skip
    if reported:
        usage["startup_available"] = 50.0
    data = reply(
        version="0.5.23" if reported else "0.5.10", model_path="meta-llama/Llama-3.1-8B-Instruct",
        tp_size=1, mem_fraction_static=0.835, max_total_num_tokens=60_000,
        max_total_tokens=60_000, cuda_graph_max_bs_decode=256,
        internal_states=[{"memory_usage": usage, "effective_max_running_requests_per_dp": 2048}],
    )  # fmt: skip
    r = rules(data, config=llama, gpu_memory_gib=None)
    hicache = r.judge({"enable_hierarchical_cache": True, "hicache_size": 20})
    assert hicache.verdict != "unsafe", hicache.reasons
    assert not any("below the 5 GiB" in reason for reason in hicache.reasons)
    assert r.judge({"mem_fraction_static": 0.835}).verdict == "possible"


def test_speculative_decodings_cap_is_read_as_resolved() -> None:
    data = reply(speculative_algorithm="EAGLE", max_running_requests=48,
                 internal_states=[{"memory_usage": {"weight": 80.0, "kvcache": 39.0,
                 "token_capacity": 582_000, "startup_available": 21.0},
                 "effective_max_running_requests_per_dp": 48}])  # fmt: skip
    r = rules(data)
    change = Change.of(r.server, {"mem_fraction_static": 0.88})
    assert change.running_cap_per_rank == 48


def test_post_capture_sizing_keeps_the_graphs_inside_the_fraction() -> None:
    llama = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
             "head_dim": 128}  # fmt: skip
    state = {"memory_usage": {"weight": 15.0, "kvcache": 100.0, "token_capacity": 819_200,
                              "startup_available": 9.0, "graph": {"decode": 4.0}},
             "effective_max_running_requests_per_dp": 4096,
             "env_vars": {"SGLANG_ENABLE_POST_CAPTURE_KV_SIZING": "1"}}  # fmt: skip
    data = reply(model_path="meta-llama/Llama-3.1-8B-Instruct", tp_size=1,
                 mem_fraction_static=0.92, max_total_num_tokens=819_200,
                 internal_states=[state])  # fmt: skip
    r = rules(data, config=llama)
    assert r.cap.graphs_inside
    assert r.cap.reserve is not None and r.cap.reserve.total_mib == 1536 + 128
    # the 4 GiB of graphs sit inside the pool: what is free after start-up is all there is
    assert r.cap.outside_now_gib == 9.0
    assert r.cap.activation_room_gib(0.92) == pytest.approx(r.cap.outside_gib(0.92)) == 9.0


def test_a_mamba_pool_grows_by_its_share_only() -> None:
    data = reply(model_path="Qwen/Qwen3-Next-80B-A3B", tp_size=4, max_total_num_tokens=1_000_000,
                 internal_states=[{"memory_usage": {"weight": 40.0, "kvcache": 30.0,
                 "token_capacity": 1_000_000, "startup_available": 21.0},
                 "effective_max_running_requests_per_dp": 400}])  # fmt: skip
    r = rules(data, config=QWEN3_NEXT)
    assert r.cap.kv_share == pytest.approx(1 / 1.9)
    change = Change.of(r.server, {"mem_fraction_static": 0.88})
    grown = 0.03 * 140.0
    assert change.tokens == pytest.approx(1_000_000 * (30.0 + grown / 1.9) / 30.0, rel=1e-3)
    assert change.running_cap_per_rank == int(400 * (30.0 * 1.9 + grown) / (30.0 * 1.9))


def test_nvml_at_tp_above_one_is_not_exact() -> None:
    h200 = GpuState(0, "NVIDIA H200", "GPU-0", 143_771 << 20, 1 << 30, 142_000 << 20, 0, 0)
    data = reply()
    data["internal_states"][0]["memory_usage"].pop("startup_available")
    r = rules(data, gpu_memory_gib=None, gpus=FakeGpuReader([h200] * 8))
    assert not r.cap.gpu.exact
    assert any("overstates" in note for note in r.notes)


def test_decode_graph_batch_in_each_spelling() -> None:
    def info(**args: Any) -> ServerInfo:
        return parse_server_info(reply(**args))

    assert decode_max_bs(info(), 143771) == 512
    old = reply(cuda_graph_max_bs=160)
    old.pop("cuda_graph_max_bs_decode")
    assert decode_max_bs(parse_server_info(old), 143771) == 160
    nested = reply(cuda_graph_config={"decode": {"max_bs": 48}})
    nested.pop("cuda_graph_max_bs_decode")
    assert decode_max_bs(parse_server_info(nested), 143771) == 48


@pytest.mark.parametrize(
    ("over", "verdict"),
    [
        ({}, "possible"),  # long shared prompts, a short queue
        ({"queued": 300}, "not_useful"),  # above 128 waiting SGLang matches no prefixes
        ({"cached_fraction": 0.05}, "not_useful"),  # few shared prefixes
        ({"avg_prompt_tokens": 400, "avg_output_tokens": 3500}, "not_useful"),  # generation
    ],
)
def test_longest_prefix_match_for_prefix_heavy_work(over: dict[str, Any], verdict: str) -> None:
    r = rules(reply())
    base = {"avg_prompt_tokens": 6000, "avg_output_tokens": 300, "cached_fraction": 0.6,
            "queued": 40}  # fmt: skip
    ctx = r.context(measurement(**{**base, **over}))
    option = evaluate({"schedule_policy": "lpm"}, ctx, "kv_cache")
    assert option.verdict == verdict, option.reasons
    proposed = [o for o in propose(ctx, "kv_cache") if "schedule_policy" in o.change]
    assert bool(proposed) == (verdict == "possible")


def test_lpm_without_the_radix_cache_is_not_useful() -> None:
    r = rules(reply(disable_radix_cache=True))
    assert r.judge({"schedule_policy": "lpm"}).verdict == "not_useful"


def test_decode_graphs_cover_a_batch_that_runs_eagerly() -> None:
    data = reply(cuda_graph_max_bs_decode=64)
    data["internal_states"][0]["memory_usage"]["graph"] = {"decode": 1.0}
    r = rules(data)
    ctx = r.context(measurement(running=150, queued=100, token_usage=0.95))
    option = next(o for o in propose(ctx, "kv_cache") if "cuda_graph_max_bs_decode" in o.change)
    assert option.change == {"cuda_graph_max_bs_decode": 160, "mem_fraction_static": 0.85}
    assert option.verdict == "possible" and "run eagerly" in " ".join(option.reasons)
    # 4096 would take 63 GiB more of graphs than today's 1 GiB at 64: no room is left
    huge = evaluate({"cuda_graph_max_bs_decode": 4096}, ctx, "kv_cache")
    assert huge.verdict == "unsafe" and "below the 5 GiB" in huge.reasons[0]
    small = r.context(measurement(running=40, queued=100, token_usage=0.95))
    assert not [o for o in propose(small, "kv_cache") if "cuda_graph_max_bs_decode" in o.change]


def test_hicache_that_turns_the_swa_pool_off_predicts_fewer_tokens() -> None:
    # SGLang turns Step-3.5's hybrid SWA pool off with HiCache: the sliding-window layers then
    # keep full-length KV, every attention layer at the full layers' cost.
    state = {"memory_usage": {"weight": 65.0, "kvcache": 54.0, "token_capacity": 873_813,
             "token_capacity_swa": 699_050, "startup_available": 21.0},
             "effective_max_running_requests_per_dp": 3413}  # fmt: skip
    for model, off in (("stepfun-ai/Step-3.5-Flash", True), ("openai/gpt-oss-120b", False)):
        data = reply(model_path=model, tp_size=1, max_total_num_tokens=873_813,
                     internal_states=[state])  # fmt: skip
        r = rules(data, config=GPT_OSS)
        change = Change.of(r.server, {"enable_hierarchical_cache": True, "hicache_size": 100})
        if off:
            assert change.bytes_per_token == 2048 * 36  # 18 full + 18 sliding layers
            assert change.tokens == int(54.0 * GIB // (2048 * 36))
        else:
            assert change.tokens == 873_813


def test_dp_attention_spells_the_flag_sglang_scales_by_three_tenths() -> None:
    # SGLang reports 0.3 x the flag under attention DP (parallel_hook.py): 0.3 means flag 1.0.
    data = dp_reply()
    data["schedule_conservativeness"] = 0.3
    r = rules(data)
    m = measurement(retractions=60, window_s=600, token_usage=0.95)
    option = next(
        o for o in propose(r.context(m), "kv_cache") if "schedule_conservativeness" in o.change
    )
    assert option.change["schedule_conservativeness"] == 1.3  # the flag; SGLang will use 0.39


def test_attention_dp_is_refused_beside_replicas() -> None:
    r = rules(reply(dp_size=2))
    option = r.judge({"attn_dp_size": 8})
    assert option.verdict == "unsafe" and "replicas" in option.reasons[0]


def test_under_dp_the_chunk_and_the_host_pool_are_read_per_rank() -> None:
    r = rules(dp_reply() | {"chunked_prefill_size": 1024})  # SGLang reports 8192 / 8
    chunk = Change.of(r.server, {"chunked_prefill_size": 4096})
    assert PrefillChunkCheck().current(chunk) == 8192  # so 4096 halves it, not quadruples it
    change = Change.of(r.server, {"enable_hierarchical_cache": True, "hicache_ratio": 2})
    per_rank_gb = 2 * 595_912 * change.bytes_per_token / 1e9
    assert HostPoolCheck().value(change) == pytest.approx(per_rank_gb)
