"""SGLang's own default reserve, term by term, against figures worked out from its code."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from playbooks.engines.sglang.reserve import Deployment, prefill_capture_sizes, sglang_reserve

OLD = (0, 5, 5)


@dataclass(frozen=True)
class Case:
    name: str
    deployment: Deployment
    total_mib: float
    floor_mib: float
    fraction: float


CASES = [
    # 0.5.5 ServerArgs._handle_gpu_memory_settings: 512 + 8192*1.5 + 256*2 + 1/8*1024 = 13440
    Case(
        "H200 TP1 dense, 0.5.5",
        Deployment(143771, decode_max_bs=256, version=OLD),
        13440,
        10240,
        0.907,
    ),
    # TP8: max_bs 512 -> 512 + 12288 + 1024 + 1024 = 14848 (sglang.md section 4)
    Case(
        "H200 TP8 dense, 0.5.5",
        Deployment(143771, tp=8, decode_max_bs=512, version=OLD),
        14848,
        10240,
        0.897,
    ),
    # The incident's RTX PRO 6000 (97,887 MiB) at TP8: SGLang's own default is 0.848.
    Case(
        "incident, 0.5.5",
        Deployment(97887, tp=8, decode_max_bs=512, mla=True, version=OLD),
        14848,
        10240,
        0.848,
    ),
    # 0.5.23 adds the MLA prefill-graph term (1536 MiB): 16384.
    Case(
        "incident, 0.5.23",
        Deployment(97887, tp=8, decode_max_bs=512, mla=True),
        16384,
        10240,
        0.833,
    ),
    # DP attention over 8 ranks: + 512*8*3 + 512*8*1.5 = 18432 MiB of padding, above the floor.
    Case(
        "incident with DP attention",
        Deployment(97887, tp=8, decode_max_bs=512, mla=True, attn_dp=8),
        34816,
        28672,
        0.644,
    ),
    # DeepEP adds 2048 after the floor.
    Case(
        "DeepEP",
        Deployment(97887, tp=8, decode_max_bs=512, mla=True, deepep=True),
        18432,
        12288,
        0.812,
    ),
    # Below 60 GiB there is no floor: the fixed and graph terms are what a recommendation keeps.
    Case(
        "A100-40GB TP1, 0.5.5",
        Deployment(40960, chunked_prefill_size=4096, decode_max_bs=32, version=OLD),
        512 + 6144 + 64 + 128,
        512 + 64 + 128,
        0.833,
    ),
    # Speculative decoding after the floor: 2048 MiB before 0.5.10, 4096 in 0.5.10-0.5.13
    # (NGRAM nothing), nothing from 0.5.14.
    Case(
        "EAGLE, 0.5.10",
        Deployment(
            81559, decode_max_bs=256, speculative="EAGLE", prefill_graphs=False, version=(0, 5, 10)
        ),
        13440 + 4096,
        10240 + 4096,
        0.785,
    ),
    Case(
        "NGRAM, 0.5.10",
        Deployment(
            81559, decode_max_bs=256, speculative="NGRAM", prefill_graphs=False, version=(0, 5, 10)
        ),
        13440,
        10240,
        0.835,
    ),
    Case(
        "EAGLE, 0.5.14",
        Deployment(
            81559, decode_max_bs=256, speculative="EAGLE", prefill_graphs=False, version=(0, 5, 14)
        ),
        13440,
        10240,
        0.835,
    ),
    # DeepEP's 2048 MiB arrives in 0.5.16.
    Case(
        "DeepEP, 0.5.15",
        Deployment(97887, tp=8, decode_max_bs=512, mla=True, deepep=True, version=(0, 5, 15)),
        16384,
        10240,
        0.833,
    ),
    # 0.5.5 adds 2048 MiB for EAGLE after the floor.
    Case(
        "EAGLE, 0.5.5",
        Deployment(81559, decode_max_bs=256, speculative="EAGLE", version=OLD),
        13440 + 2048,
        10240 + 2048,
        0.810,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_reserve_matches_sglangs_arithmetic(case: Case) -> None:
    reserve = sglang_reserve(case.deployment)
    assert reserve.total_mib == pytest.approx(case.total_mib)
    assert reserve.floor_mib == pytest.approx(case.floor_mib)
    assert reserve.default_fraction(case.deployment.gpu_mib) == pytest.approx(case.fraction)


def test_dense_0523_counts_the_prefill_capture_sizes() -> None:
    sizes = prefill_capture_sizes(8192)
    assert sizes[:3] == [4, 8, 12] and sizes[-1] == 8192
    reserve = sglang_reserve(Deployment(81559, decode_max_bs=256))
    assert reserve.graph_mib == 512 + 8 * len(sizes)


def test_chunking_off_counts_max_prefill_tokens() -> None:
    on = sglang_reserve(Deployment(40960, chunked_prefill_size=4096, version=OLD))
    off = sglang_reserve(
        Deployment(40960, chunked_prefill_size=-1, max_prefill_tokens=16384, version=OLD)
    )
    assert off.activation_mib - on.activation_mib == pytest.approx((16384 - 4096) * 1.5)


# (layers, hidden) of the image encoder, SGLang's factor on a VLM's default fraction:
# 0.95 x clamp(1 - 0.1 x (L x H**2 / (24 x 1024**2) - 1), 0.8, 1.05)
VISION = [
    ((24, 1024), 0.95),  # ViT-L/14, the baseline
    ((24, 1280), 0.95 * (1 - 0.1 * 0.5625)),  # Qwen2.5-VL: `depth` 32 unread, so 24 x 1280
    ((40, 1536), 0.95 * 0.8),  # past the clamp
    ((12, 768), 0.95 * 1.05),  # a small encoder: the upper clamp
]


@pytest.mark.parametrize(("vision", "factor"), VISION)
def test_a_vlm_default_is_the_rules_times_the_encoders_factor(
    vision: tuple[int, int], factor: float
) -> None:
    text = sglang_reserve(Deployment(81559, decode_max_bs=256))
    vlm = sglang_reserve(Deployment(81559, decode_max_bs=256, vision=vision))
    rule = text.default_fraction(81559)
    assert vlm.rule_mib == text.total_mib  # SGLang's `reserved_mem` is the text model's
    assert vlm.default_fraction(81559) == pytest.approx(rule * factor)
    # the encoder's room is counted in the reserve and in the floor a recommendation keeps
    room = 81559 * rule * (1 - factor)
    assert vlm.total_mib == pytest.approx(text.total_mib + room)
    assert vlm.floor_mib == pytest.approx(text.floor_mib + room)
    assert any(name.startswith("image encoder") for name, _ in vlm.parts)


def test_a_vlm_sized_after_capture_keeps_8_gib() -> None:
    d = Deployment(81559, decode_max_bs=256, post_capture=True, vision=(24, 1280))
    text = sglang_reserve(Deployment(81559, decode_max_bs=256, post_capture=True))
    vlm = sglang_reserve(d)
    assert vlm.total_mib == pytest.approx(text.total_mib + 8192)
    expected = text.default_fraction(81559) - 8192 / 81559
    assert vlm.default_fraction(81559) == pytest.approx(expected)
