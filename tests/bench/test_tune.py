"""`bench.tune` end to end on a thin grid, and its oracle's measure against the twin itself."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from bench import tune
from bench.tune_scenarios import scenario_named
from bench.tune_twin import Died, TwinServer, evaluate, with_peak


def test_quickest_run_reports_and_its_oracle_beats_every_configuration(tmp_path: Path) -> None:
    # --quick on the client-bound scenario, its grid thinned to two fractions and one chunk
    scenario = replace(
        scenario_named("client-bound"), fractions=(0.85, 0.88), chunks=(8192,), warm_s=300.0
    )
    run = tune.execute([scenario], tune.Mode(quick=True), workers=1)
    results = tune.judge(run)
    text = tune.report(run, results)
    for heading in (
        "| scenario | hidden peak",
        "| scenario | oracle's configuration",
        "| scenario | peak share | kept change",
        "calibration coverage",
    ):
        assert heading in text
    (r,) = results
    assert len(r.peaks) == len(tune.Mode(quick=True).shares(scenario))
    sr = run.runs[0]
    tried = [run.evals[k] for k in tune._candidates(run, sr)]
    assert r.oracle > 0
    for e in tried:
        if e.started and all(e.survives(x) for x in sr.scales):
            assert r.oracle >= e.rate
    for p in r.peaks:
        assert p.final <= p.oracle_here + 1e-9
        assert p.restarts >= 0 and p.minutes > 0
    data = tune.to_json(run, results)
    json.dumps(data, default=str)
    assert set(data) >= {"summary", "scenarios", "campaigns"}


def test_the_oracle_reads_the_death_a_run_with_the_hidden_peak_has() -> None:
    """One run at the modelled peak says when each hidden peak kills the configuration; the
    twin started with that peak dies then."""
    args = [
        "--preset",
        "kimi-k2.5-rtxpro6000-tp8",
        "--enable-metrics",
        "--mem-fraction-static",
        "0.88",
    ]
    e = evaluate(args, "long-prompt", 24, seed=3, warm_s=60.0, end_s=300.0)
    t, tokens = e.records[-1]
    need = e.base_gib + e.per_ktoken_gib * tokens / 1000
    dies, fits = e.room_gib / need * 1.01, e.room_gib / need * 0.99
    assert e.survives(fits)
    assert e.dies_at(dies) == t
    server = TwinServer(with_peak(args, dies), "long-prompt", 24, seed=3, t0=0.0)
    with pytest.raises(Died) as exc:
        server.advance(300.0)
    assert exc.value.t == pytest.approx(t)
    TwinServer(with_peak(args, fits), "long-prompt", 24, seed=3, t0=0.0).advance(300.0)


def test_the_twins_free_gpu_memory_is_the_room_less_its_largest_batch_so_far() -> None:
    """What the campaign's room check reads (NVML's view): the true peak, hidden scale and all,
    so a server whose batches need more leaves less free."""
    args = ["--preset", "kimi-k2.5-rtxpro6000-tp8", "--enable-metrics"]
    args += ["--mem-fraction-static", "0.88"]
    e = evaluate(args, "long-prompt", 24, seed=3, warm_s=60.0, end_s=300.0)
    _, largest = e.records[-1]
    free = {}
    for scale in (1.0, 1.5):
        server = TwinServer(with_peak(args, scale), "long-prompt", 24, seed=3, t0=0.0)
        before = server.rt.gpu_free_gib()
        server.advance(300.0)
        free[scale] = server.rt.gpu_free_gib()
        need = (e.base_gib + e.per_ktoken_gib * largest / 1000) * scale
        assert before == pytest.approx(e.room_gib)  # nothing has run yet
        assert free[scale] == pytest.approx(e.room_gib - need, abs=1e-6)
    assert free[1.5] < free[1.0]
