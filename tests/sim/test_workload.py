"""The multi-turn clients are a steady population: a server just started sees every turn."""

from __future__ import annotations

import statistics

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
