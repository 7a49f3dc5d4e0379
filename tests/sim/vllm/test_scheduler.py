"""The v1 scheduler in simulated time: token budget, blocks, prefix cache, preemption."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest

from sim.request import Request
from sim.vllm.presets import LLAMA_8B_H100
from sim.vllm.scheduler import Scheduler, SchedulerConfig
from sim.workload import make_profile


def sched(blocks: int, *, seqs: int = 256, budget: int = 8192, caching: bool = True) -> Scheduler:
    return Scheduler(
        SchedulerConfig(
            preset=LLAMA_8B_H100.base,
            num_gpu_blocks=blocks,
            block_size=16,
            max_num_seqs=seqs,
            max_num_batched_tokens=budget,
            max_model_len=8192,
            enable_prefix_caching=caching,
            kv_bytes_per_token=131_072,
        )
    )


def req(rid: str, n_in: int, out: int, first: int = 0) -> Request:
    return Request(rid, tuple(range(first, first + n_in)), out, 0.0)


def drain(s: Scheduler, limit: int = 100_000) -> None:
    for _ in range(limit):
        if s.step() == 0.0:
            return
    raise AssertionError("did not drain")


def test_chunked_prefill_within_the_token_budget() -> None:
    s = sched(1000, budget=512)
    r = req("a", 1200, 4)
    s.submit(r)
    s.step()
    assert r.prefilled == 512 and r.out_len == 0
    s.step()
    assert r.prefilled == 1024
    s.step()  # the last 176 tokens: the prefill completes and samples a token
    assert r.out_len == 1 and r.first_token_at == s.now
    drain(s)
    assert r.finish_reason == "length" and r.out_len == 4
    assert s.counters.prompt_tokens == 1200 and s.counters.generation_tokens == 4
    assert s.kv_usage == 0.0  # cached blocks are free


def test_decodes_come_first_then_prefill_chunks() -> None:
    s = sched(1000, budget=100)
    a = req("a", 50, 10)
    s.submit(a)
    s.step()
    b = req("b", 500, 10, first=10_000)
    s.submit(b)
    s.step()
    # a decoded one token and b got the rest of the budget
    assert a.out_len == 2 and b.prefilled == 99


def test_max_num_seqs_caps_running() -> None:
    s = sched(1000, seqs=2)
    for i in range(4):
        s.submit(req(f"r{i}", 20, 5, first=i * 1000))
    s.step()
    assert len(s.running) == 2 and len(s.waiting) == 2


def test_preemption_by_recompute_when_blocks_run_out() -> None:
    # 11 blocks (one is the null block): two requests of 64-token prompts (4 blocks each)
    # growing by 40 tokens cannot both finish.
    s = sched(11, caching=False)
    a, b = req("a", 64, 40), req("b", 64, 40, first=1000)
    s.submit(a)
    s.submit(b)
    s.step()
    assert len(s.running) == 2
    while s.counters.preemptions == 0:
        assert s.step() > 0
    # the newest running request was preempted and went back to the front, nothing computed
    assert s.waiting[0] is b and b.prefilled == 0 and b.retractions == 1
    assert s.running == [a]
    drain(s)
    assert a.finish_reason == b.finish_reason == "length"
    assert b.out_len == 40
    # prompt tokens are counted once although b was prefilled twice
    assert s.counters.prompt_tokens == 128
    assert s.counters.prompt_computed > 128


def test_whole_prompt_must_fit_to_be_admitted() -> None:
    s = sched(11, caching=False)
    s.submit(req("a", 100, 500))
    s.step()
    s.submit(req("big", 160, 5, first=5000))  # 10 blocks: never fits beside a
    s.step()
    assert len(s.running) == 1 and len(s.waiting) == 1
    assert s.kv_usage > 0.6


def test_prefix_cache_hits_full_blocks_only() -> None:
    s = sched(1000)
    s.submit(req("a", 100, 1))
    drain(s)
    b = req("b", 120, 1)  # shares the first 100 tokens: 6 full blocks = 96 tokens
    s.submit(b)
    drain(s)
    assert b.cached_tokens == 96
    assert s.counters.prefix_queries == 220 and s.counters.prefix_hits == 96
    off = sched(1000, caching=False)
    off.submit(req("a", 100, 1))
    drain(off)
    c = req("c", 120, 1)
    off.submit(c)
    drain(off)
    assert c.cached_tokens == 0


def test_step_duration_uses_the_preset_step_model() -> None:
    s = sched(1000)
    s.submit(req("a", 1000, 3))
    prefill = s.step()
    st = LLAMA_8B_H100.base.step
    assert prefill > st.prefill_base_s + 1000 / st.prefill_tokens_per_s
    decode = s.step()
    assert st.decode_base_s < decode < prefill


def test_abort_frees_blocks() -> None:
    s = sched(1000, seqs=1)
    a, b = req("a", 64, 100), req("b", 64, 100, first=500)
    s.submit(a)
    s.submit(b)
    s.step()
    assert s.abort("b") and b.finish_reason == "abort"  # waiting: finished at once
    assert s.abort("a")
    s.step()
    assert a.finish_reason == "abort" and s.kv_usage == 0.0 and s.idle
    assert s.counters.finished == {"abort": 2}


def closed_loop(profile: str, *, stretches: bool, blocks: int, users: int) -> tuple[Any, ...]:
    """`users` clients of a workload profile against a small cache, for 120 simulated seconds,
    stepping one step at a time (horizon -inf) or with quiet stretches up to the end; everything
    observable."""
    s = sched(blocks, seqs=32, budget=2048)
    workload = make_profile(profile, seed=3)
    finished: list[tuple[str, int, int, float]] = []
    observed: list[tuple[int, int, int]] = []  # (steps, iteration tokens, generated) per call
    s.on_step = lambda _, st: observed.append((st.steps, st.iteration_tokens, st.generated))

    def next_request(user: int) -> None:
        spec = workload.next_request(user)
        out = min(spec.max_new_tokens, 8192 - len(spec.input_ids))
        r = Request(f"u{user}-{len(finished)}", spec.input_ids, out, s.now)

        def done(r: Request, spec: object = spec, user: int = user) -> None:
            assert r.finished_at is not None
            finished.append((r.rid, r.out_len, r.retractions, r.finished_at))
            workload.completed(user, spec, r.output_ids)  # type: ignore[arg-type]
            next_request(user)

        r.on_finish = done
        s.submit(r)

    for user in range(users):
        next_request(user)
    horizon = 120.0 if stretches else -math.inf
    while s.now < 120.0 and s.step(horizon):
        pass
    per_step = Counter[tuple[int, int]]()
    for steps, tokens, generated in observed:
        per_step[(tokens, generated // steps)] += steps
    c = s.counters
    return (
        [(rid, out, retr) for rid, out, retr, _ in finished],
        [round(at, 6) for *_, at in finished],
        (c.preemptions, c.prompt_tokens, c.prompt_computed, c.generation_tokens),
        (c.prefix_queries, c.prefix_hits, s.steps, len(s.waiting), len(s.running)),
        round(s.kv_usage, 9),
        per_step,
    )


@pytest.mark.parametrize(("profile", "blocks"), [("incident", 3000), ("multi-turn", 1500)])
def test_quiet_stretches_change_nothing_observable(profile: str, blocks: int) -> None:
    """Running the decode steps between events in one go gives the same finishes, preemptions,
    prefix hits, counters, step count and per-step observations as stepping one at a time."""
    one_by_one = closed_loop(profile, stretches=False, blocks=blocks, users=48)
    stretched = closed_loop(profile, stretches=True, blocks=blocks, users=48)
    assert stretched == one_by_one
    finishes, _, counters, *_ = one_by_one
    assert len(finishes) > 20 and counters[0] > 0  # requests finished and were preempted


def test_a_stretch_stops_at_the_horizon() -> None:
    s = sched(1000)
    s.submit(req("a", 64, 5000))
    s.step()  # the prefill and the first token
    start, steps = s.now, s.steps
    s.step(horizon=start + 1.0)
    assert s.now <= start + 1.0 + 0.05 and s.steps - steps > 10  # many steps, none past it
    assert s.step(horizon=s.now) > 0  # at the horizon: one ordinary step
