"""The reservation SGLang's admission makes for running requests, table-style."""

from __future__ import annotations

from typing import Any

import pytest

from playbooks.engines.sglang.facts import is_retracting
from playbooks.engines.sglang.reservation import (
    CONSERVATIVENESS_SATURATION,
    binding_reservation,
    floor_ratio,
    initial_ratio,
    ratio_in_use,
    reservation_of,
)
from tests.playbooks.engines.sglang.test_rules import measurement

POOL = 16_000
# The real 0.5.23 server on a 16,000-token pool, 48 clients of 200 + 1,000 fixed-length tokens.
SMALL_POOL = {
    "avg_prompt_tokens": 200,
    "avg_output_tokens": 1000,
    "running": 13,
    "queued": 35,
    "token_usage": 0.73,
    "retractions_seen_in_gauge": 0,
    "retractions": 0,
}
OLD, NEW = (0, 5, 10), (0, 5, 23)


@pytest.mark.parametrize(
    ("conservativeness", "initial", "floor"),
    [(1.0, 0.7, 0.098), (0.5, 0.35, 0.049), (1.0 / 0.7, 1.0, 0.14), (2.0, 1.0, 0.14)],
)
def test_the_ratio_saturates_at_one(conservativeness: float, initial: float, floor: float) -> None:
    assert initial_ratio(conservativeness) == pytest.approx(initial)
    assert floor_ratio(conservativeness) == pytest.approx(floor)


def test_conservativeness_saturates_near_1_43() -> None:
    assert initial_ratio(CONSERVATIVENESS_SATURATION) == 1.0
    assert initial_ratio(1.42) < 1.0
    assert round(CONSERVATIVENESS_SATURATION, 2) == 1.43


# measurement overrides, conservativeness, the ratio admission applies and where it comes from
RATIOS: list[tuple[dict[str, Any], float, float, str]] = [
    ({"new_token_ratio": 0.45}, 1.0, 0.45, "sglang:new_token_ratio"),
    ({"retractions_seen_in_gauge": 0}, 1.0, 0.098, "settled"),
    ({"retractions_seen_in_gauge": 0}, 2.0, 0.14, "settled"),
    ({"retractions_seen_in_gauge": 3}, 1.0, 0.7, "initial"),
    ({"retractions": 4, "retractions_seen_in_gauge": 0}, 0.5, 0.35, "initial"),
]


@pytest.mark.parametrize(("over", "c", "ratio", "words"), RATIOS)
def test_ratio_in_use(over: dict[str, Any], c: float, ratio: float, words: str) -> None:
    m = measurement(**over)
    found, source = ratio_in_use(m, c, is_retracting(m))
    assert found == pytest.approx(ratio)
    assert words in source


# measurement overrides, fixed length, reserved, next request's need, full
# 11,680 tokens held by 13 requests of 200-token prompts: 9,080 output tokens so far of their
# 13,000, so 3,920 remain
RESERVED: list[tuple[dict[str, Any], bool, float, float, bool]] = [
    (SMALL_POOL, True, 3920, 1201, True),
    (SMALL_POOL, False, 3920 * 0.098, 1201, False),
    ({**SMALL_POOL, "avg_output_tokens": 20_000}, True, 13 * 4096, 200 + 4096 + 1, True),  # clip
    # 3,200 held by 4: 600 out so far, 400 to go
    ({**SMALL_POOL, "token_usage": 0.2, "running": 4}, True, 4 * 400, 1201, False),
    # held per request below the prompt (shared prefixes): half the answer is assumed
    ({**SMALL_POOL, "token_usage": 0.1}, True, 13 * 500, 1201, False),
]


@pytest.mark.parametrize(("over", "fixed", "reserved", "need", "full"), RESERVED)
def test_reservation_of(
    over: dict[str, Any], fixed: bool, reserved: float, need: float, full: bool
) -> None:
    r = reservation_of(measurement(**over), POOL, ratio=(0.098, "test"), fixed_length=fixed)
    assert r is not None
    assert r.reserved == pytest.approx(reserved)
    assert r.next_need == pytest.approx(need)
    assert r.held == pytest.approx(over["token_usage"] * POOL)
    assert r.full is full


@pytest.mark.parametrize(
    "over",
    [
        {"token_usage": None},
        {"avg_output_tokens": None},
        {"avg_prompt_tokens": None},
        {"running": 0},
    ],
)
def test_no_reservation_without_the_numbers(over: dict[str, Any]) -> None:
    m = measurement(**{**SMALL_POOL, **over})
    assert reservation_of(m, POOL, ratio=(0.1, "test"), fixed_length=True) is None


# measurement overrides, version, conservativeness, context length, None or (basis, ratio)
Expected = tuple[str, float] | None
BindingRow = tuple[dict[str, Any], tuple[int, int, int], float, int | None, Expected]
# 13 running with 1,000-token answers hold 11,680 of 16,000: by their answers 0.5.10 leaves room
# (11,680 + 13 x 300 x 0.098 + 1,201 = 13,263 < 0.85 x 16,000), but with a max_tokens of 4,096
# (or none) each reserves 0.098 x ~3,400 and the next needs 4,297: 20,305, full
BINDING: list[BindingRow] = [
    (SMALL_POOL, NEW, 1.0, None, ("fixed_length", 1.0)),  # 0.5.23: fixed length, in full
    (SMALL_POOL, OLD, 1.0, None, ("max_tokens", 0.098)),  # 0.5.10: only a generous max_tokens
    # a context of 2,048 still lets a request ask 1,847: full; one of 1,400 only 1,199, near
    # the answers, so nothing beyond them is read
    (SMALL_POOL, OLD, 1.0, 2048, ("max_tokens", 0.098)),
    (SMALL_POOL, OLD, 1.0, 1400, None),
    ({**SMALL_POOL, "new_token_ratio": 0.7}, OLD, 1.0, None, ("ratio", 0.7)),  # the ratio binds
    ({**SMALL_POOL, "new_token_ratio": 0.7}, NEW, 1.0, None, ("ratio", 0.7)),  # ratio first
    ({**SMALL_POOL, "retractions_seen_in_gauge": 2}, OLD, 1.0, None, ("ratio", 0.7)),
    # 5 running hold 4,800: with 4,096-token limits a finish still makes room for two more
    # ((4,800 + 1,635) x 4/5 + 2 x 4,297 = 13,742 < 0.9 x 16,000): the count still grows
    ({**SMALL_POOL, "token_usage": 0.3, "running": 5}, NEW, 1.0, None, None),
    # answers of ~3,500 against a limit of at most 4,096: no reading beyond the answers'
    ({**SMALL_POOL, "avg_output_tokens": 3500, "token_usage": 0.3}, OLD, 1.0, None, None),
]


@pytest.mark.parametrize(("over", "version", "c", "context", "expected"), BINDING)
def test_binding_reservation(
    over: dict[str, Any],
    version: tuple[int, int, int],
    c: float,
    context: int | None,
    expected: tuple[str, float] | None,
) -> None:
    r = binding_reservation(
        measurement(**over),
        POOL,
        version,
        c,
        retracting=bool(over.get("retractions_seen_in_gauge")),
        context_len=context,
    )
    if expected is None:
        assert r is None
        return
    assert r is not None and r.full
    assert r.basis == expected[0]
    assert r.fixed_length is (expected[0] == "fixed_length")
    assert r.ratio == pytest.approx(expected[1])


def test_under_limits_admission_stops_where_a_finish_makes_room_for_one_but_not_two() -> None:
    """The real 0.5.23 server with no max_tokens: 11.7 running at 22% of 16,000, answers of
    200 tokens, 200-token prompts; one request's need leaves it at 0.77 of the pool."""
    m = measurement(
        avg_prompt_tokens=200, avg_output_tokens=200, running=11.7, queued=35, token_usage=0.22
    )
    r = reservation_of(m, POOL, ratio=(0.098, "test"), limit=4096)
    assert r is not None and r.refused_at == 2 and r.full
    one_need = r.held + r.reserved + r.next_need
    assert one_need / POOL == pytest.approx(0.77, abs=0.01)


def test_a_generous_max_tokens_reserves_up_to_the_clip_and_the_next_needs_it_whole() -> None:
    m = measurement(**SMALL_POOL)
    r = reservation_of(m, POOL, ratio=(0.098, "test"), limit=4096)
    assert r is not None and r.basis == "max_tokens" and r.answer == 1000
    # 11,680 held by 13: 698 out so far, 4,096 - 698 = 3,398 may still come
    assert r.reserved == pytest.approx(13 * (4096 - (11680 / 13 - 200)) * 0.098)
    assert r.next_need == 200 + 4096 + 1
