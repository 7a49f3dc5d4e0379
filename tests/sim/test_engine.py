"""The scheduler reproduces the incident and SGLang's admission, retraction and caching."""

from __future__ import annotations

import pytest

from sim.args import resolve
from sim.engine import Engine, GpuOutOfMemory, HostOutOfMemory, Request
from sim.simulate import engine_config, simulate
from sim.workload import make_profile

INCIDENT = ["--mem-fraction-static", "0.85"]


@pytest.fixture(scope="module")
def incident() -> object:
    return simulate(INCIDENT, profile="incident", concurrency=150, duration=900)


def test_incident_reproduces(incident: object) -> None:
    stats = incident
    assert stats.capacity == 116_171  # type: ignore[attr-defined]
    running = stats.mean("running")  # type: ignore[attr-defined]
    queued = stats.mean("queued")  # type: ignore[attr-defined]
    assert 45 <= running <= 56, running
    assert 94 <= queued <= 105, queued
    assert stats.mean("token_usage") >= 0.9  # type: ignore[attr-defined]
    gen = stats.mean("gen_throughput")  # type: ignore[attr-defined]
    assert 700 <= gen <= 950, gen
    # Token counters only move at completion: over the first ten minutes the completed tokens
    # per second are well below the decode rate.
    early = [s for s in stats.samples if s.t <= 600]  # type: ignore[attr-defined]
    effective = early[-1].completed_tokens_total / 600
    assert effective < 0.85 * gen, (effective, gen)
    assert stats.retracted > 0  # type: ignore[attr-defined]


def test_higher_fraction_raises_capacity_and_throughput(incident: object) -> None:
    better = simulate(
        ["--mem-fraction-static", "0.88"], profile="incident", concurrency=150, duration=900
    )
    assert abs(better.capacity - 159_000) / 159_000 < 0.01
    assert better.mean("running") > incident.mean("running") + 12  # type: ignore[attr-defined]
    assert better.mean("gen_throughput") > 1.1 * incident.mean("gen_throughput")  # type: ignore[attr-defined]


def test_fp8_kv_doubles_capacity() -> None:
    fp8 = simulate(
        [*INCIDENT, "--kv-cache-dtype", "fp8_e4m3"],
        profile="incident",
        concurrency=150,
        duration=300,
    )
    assert fp8.capacity == pytest.approx(2 * 116_171, abs=2)
    assert fp8.mean("running") > 85


def test_0_93_dies_under_load() -> None:
    with pytest.raises(GpuOutOfMemory, match="CUDA out of memory"):
        simulate(
            ["--mem-fraction-static", "0.93"], profile="incident", concurrency=150, duration=60
        )


def test_0_93_survives_light_load() -> None:
    stats = simulate(
        ["--mem-fraction-static", "0.93"], profile="short-chat", concurrency=4, duration=60
    )
    assert stats.completed > 0


def test_hicache_48_kills_the_host_on_old_versions() -> None:
    with pytest.raises(HostOutOfMemory):
        simulate(
            [
                *INCIDENT,
                "--sglang-version",
                "0.5.5",
                "--enable-hierarchical-cache",
                "--hicache-size",
                "48",
            ],
            profile="incident",
            concurrency=10,
            duration=30,
        )


def test_client_bound_has_no_queue() -> None:
    stats = simulate(INCIDENT, profile="incident", concurrency=8, duration=300)
    assert stats.mean("queued") == 0
    assert stats.mean("running") == pytest.approx(8, abs=0.5)
    assert stats.mean("token_usage") < 0.4


def test_multi_turn_reuses_prefixes_and_hicache_helps() -> None:
    base = ["--preset", "llama-3.1-8b-h100", "--max-total-tokens", "60000"]
    plain = simulate(base, profile="multi-turn", concurrency=48, duration=600)
    hier = simulate(
        [*base, "--enable-hierarchical-cache", "--hicache-ratio", "4"],
        profile="multi-turn",
        concurrency=48,
        duration=600,
    )
    plain_hit = plain.cached_tokens / plain.prompt_tokens
    hier_hit = hier.cached_tokens / hier.prompt_tokens
    # The GPU pool cannot keep 48 conversations: most prefixes are evicted before they return.
    assert 0.02 < plain_hit < 0.4
    # The host tier keeps them and loads them back instead of recomputing.
    assert hier.host_cached_tokens > 0.3 * hier.prompt_tokens
    assert hier_hit > 2 * plain_hit
    assert hier.completed > 1.2 * plain.completed


def test_hicache_does_not_help_without_reuse() -> None:
    plain = simulate(INCIDENT, profile="incident", concurrency=150, duration=600)
    hier = simulate(
        [*INCIDENT, "--enable-hierarchical-cache"],
        profile="incident",
        concurrency=150,
        duration=600,
    )
    assert hier.host_cached_tokens < 0.05 * hier.prompt_tokens
    assert hier.generation_rate <= plain.generation_rate * 1.02  # decode cost, no gain


def test_kv_accounting_invariant_holds_every_step() -> None:
    cfg = resolve(
        [
            "--preset",
            "llama-3.1-8b-h100",
            "--max-total-tokens",
            "20000",
            "--enable-hierarchical-cache",
            "--hicache-ratio",
            "3",
            "--chunked-prefill-size",
            "1024",
        ]
    )
    engine = Engine(engine_config(cfg))
    prof = make_profile("multi-turn", 3)
    n = [0]

    def submit(user: int) -> None:
        spec = prof.next_request(user)
        n[0] += 1
        req = Request(f"r{n[0]}", spec.input_ids, spec.max_new_tokens, engine.now)

        def done(r: Request, spec: object = spec, user: int = user) -> None:
            prof.completed(user, spec, r.output_ids)  # type: ignore[arg-type]
            submit(user)

        req.on_finish = done
        engine.submit(req)

    for u in range(24):
        submit(u)
    for _ in range(6000):
        engine.step()
        held = sum(r.private for r in engine.running) + (
            engine.chunked.private if engine.chunked and engine.chunked not in engine.running else 0
        )
        assert engine.private_total == held
        assert engine.free + engine.tree.device_tokens + engine.private_total == engine.size
        assert engine.free >= 0
    engine.tree.check()
    assert engine.retracted_total > 0


def test_retraction_picks_fewest_outputs_and_raises_ratio() -> None:
    cfg = resolve(
        ["--preset", "llama-3.1-8b-h100", "--max-total-tokens", "6000", "--disable-radix-cache"]
    )
    engine = Engine(engine_config(cfg))
    events: list[tuple[int, float, float]] = []

    class Obs:
        def prefill_batch(self, e: Engine, s: object) -> None: ...
        def decode_log(self, e: Engine, s: object) -> None: ...
        def retracted(self, e: Engine, n: int, old: float, new: float) -> None:
            events.append((n, old, new))

    engine.observer = Obs()
    # Staggered lengths: finishes keep re-opening admission while the ratio decays, so the
    # scheduler over-admits and must retract, as SGLang does under long generations.
    for i in range(40):
        engine.submit(Request(f"r{i}", tuple(range(3, 203)), 300 + (i * 137) % 1700, 0.0))
    while not engine.idle and engine.now < 3000:
        engine.step()
    assert events, "the pool is too small for all requests: something must be retracted"
    assert all(new > old or new == 1.0 for _, old, new in events)
    assert engine.idle  # everything eventually finished after re-prefill


def test_decode_moments_skip_the_step_after_a_prefill_or_an_idle_gap() -> None:
    """As SGLang 0.5.23 counts them: only a decode step whose step before was a decode step,
    with no idle gap between, enters the moments (its launch cadence is a step time)."""
    engine = Engine(engine_config(resolve(INCIDENT)))
    for i in range(4):  # four 200-token prompts in one prefill batch, then 30 decode steps
        engine.submit(Request(f"a{i}", tuple(range(3, 203)), 31, 0.0))
    while not engine.idle:
        engine.step()
    steps, batch, _, _, _, generated = engine.decode_moments
    assert engine.forward_ct_decode == 30 and steps == 29  # the first decode followed a prefill
    assert batch == generated == 4 * 29
    engine.advance_idle(engine.now + 10.0)
    engine.submit(Request("b", tuple(range(3, 203)), 11, engine.now))
    while not engine.idle:
        engine.step()
    assert engine.decode_moments[0] == 29 + 9  # again one step not counted after the prefill


def test_the_decode_count_counts_decode_steps_and_the_metrics_show_it_at_every_scrape() -> None:
    """SGLang 0.5.23 moves `realtime_tokens_total{mode="decode"}` at every decode step (not for
    the token a prefill samples); the twin's exposition brings it up to the engines' totals
    whenever it is scraped, so a count between two decode logs is current."""
    from playbooks.engines.sglang import ENGINE  # noqa: PLC0415
    from sim.runtime import Runtime  # noqa: PLC0415

    rt = Runtime(resolve([*INCIDENT, "--sglang-version", "0.5.23"]))
    rt.build_engines()
    engine = rt.engines[0]
    for i in range(4):
        engine.submit(Request(f"a{i}", tuple(range(3, 203)), 31, 0.0))
    while not engine.idle:
        engine.step()
    assert engine.decoded_total == 4 * 30 and engine.generated_total == 4 * 31
    assert engine.prefill_computed_total == 4 * 200
    snap = ENGINE.snapshot(ENGINE.parse_metrics(rt.metrics.exposition().decode()))
    assert snap.decoded_tokens == 120.0
    engine.submit(Request("b", tuple(range(3, 203)), 3, engine.now))
    while not engine.idle:
        engine.step()
    snap = ENGINE.snapshot(ENGINE.parse_metrics(rt.metrics.exposition().decode()))
    assert snap.decoded_tokens == 122.0
    old = Runtime(resolve([*INCIDENT, "--sglang-version", "0.5.10"]))
    old.build_engines()
    assert "realtime_tokens" not in old.metrics.exposition().decode()
