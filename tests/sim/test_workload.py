"""The multi-turn clients are a steady population: a server just started sees every turn."""

from __future__ import annotations

import statistics

import pytest

from sim.workload import make_profile

USERS = 400


def _mean_prompt(turns: int, seed: int) -> tuple[float, float]:
    """Mean prompt length of the users' first request, and of their `turns`-th."""
    prof = make_profile("multi-turn", seed)
    first = [prof.next_request(u) for u in range(USERS)]
    later = first
    for _ in range(turns):
        for spec in later:
            prof.completed(spec.user, spec, list(range(3, 3 + spec.max_new_tokens)))
        later = [prof.next_request(u) for u in range(USERS)]
    return (
        statistics.fmean(len(s.input_ids) for s in first),
        statistics.fmean(len(s.input_ids) for s in later),
    )


def test_first_requests_have_the_steady_mix_of_turns() -> None:
    prof = make_profile("multi-turn", 1)
    turns = [prof.next_request(u).turn for u in range(USERS)]
    assert set(turns) == set(range(8))  # every turn of an 8-turn session
    assert 2.5 < statistics.fmean(turns) < 4.5  # uniform: 3.5 on average


def test_prompts_after_a_start_are_as_long_as_later_ones() -> None:
    first, later = _mean_prompt(turns=12, seed=2)
    assert abs(first / later - 1) < 0.1, (first, later)


def test_a_session_still_ends_after_its_turns() -> None:
    prof = make_profile("multi-turn", 3)
    spec = prof.next_request(0)
    seen = [spec.turn]
    for _ in range(20):
        prof.completed(0, spec, [5] * spec.max_new_tokens)
        spec = prof.next_request(0)
        seen.append(spec.turn)
    assert max(seen) == 7 and seen.count(0) >= 2  # back to turn 0 once a session is done


def test_uniform_profile_draws_lengths_from_its_ranges() -> None:
    prof = make_profile("uniform", 3)
    specs = [prof.next_request(u % 150) for u in range(2000)]
    prompts = [len(s.input_ids) for s in specs]
    outputs = [s.max_new_tokens for s in specs]
    assert 400 <= min(prompts) < 420 and 980 < max(prompts) <= 1000
    assert 1000 <= min(outputs) < 1100 and 3900 < max(outputs) <= 4000
    # flat, not peaked: each quarter of the output range holds about a quarter of the requests
    quarters = [sum(1000 + 750 * q <= o < 1000 + 750 * (q + 1) for o in outputs) for q in range(4)]
    assert all(400 <= n <= 600 for n in quarters), quarters
    assert all(s.ignore_eos for s in specs)
    again = make_profile("uniform", 3)
    assert [again.next_request(u % 150) for u in range(2000)] == specs


def test_conversations_come_back_after_the_others() -> None:
    """150 clients over 600 conversations: a history returns about 450 requests later (a pick
    among the 450 free ones), and no conversation is asked twice at once."""
    prof = make_profile("conversations", 4, conversations=600)
    gaps: list[int] = []
    last: dict[tuple[int, ...], int] = {}
    in_flight = [prof.next_request(u) for u in range(150)]
    for step in range(3000):
        spec = in_flight[step % 150]
        key = spec.input_ids[:700]  # the system prompt and the start of its document
        if key in last:
            gaps.append(step - last[key])
        last[key] = step
        prof.completed(spec.user, spec, [7] * spec.max_new_tokens)
        in_flight[step % 150] = prof.next_request(spec.user)
    assert 400 < statistics.fmean(gaps) < 520, statistics.fmean(gaps)
    assert len({s.input_ids[:700] for s in in_flight}) == 150


def test_a_failed_turn_frees_its_conversation() -> None:
    prof = make_profile("conversations", 5, conversations=2)
    prof.next_request(0)
    prof.next_request(1)
    prof.next_request(0)  # the first failed: its conversation is taken again, not lost
    prof.completed(1, prof.next_request(1), [3])
    assert prof.most_clients() == 2


def test_the_working_set_is_the_size_asked_for() -> None:
    prof = make_profile("working-set", 6, working_set_tokens=120_000)
    specs = [prof.next_request(u) for u in range(3000)]
    documents = {s.input_ids[:4000] for s in specs}
    assert len(documents) == 30  # 120,000 tokens of 4,000-token documents, every one asked
    assert all(4050 <= len(s.input_ids) <= 4150 and s.max_new_tokens <= 300 for s in specs)


def test_a_profile_option_that_does_not_exist_is_refused_with_the_ones_that_do() -> None:
    with pytest.raises(ValueError, match=r"no option conversation; its options: .*conversations"):
        make_profile("conversations", 0, conversation=10)
    with pytest.raises(ValueError, match="must hold at least one document"):
        make_profile("working-set", 0, working_set_tokens=100)
