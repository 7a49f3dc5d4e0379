"""The approved plan is what runs: its arguments and gate settings, or nothing when it is stale."""

from __future__ import annotations

from playbooks.experiments import machine
from playbooks.experiments.advance import settings_of
from playbooks.experiments.outcome import Outcome, ending
from playbooks.experiments.restart_limits import RestartLimiter
from playbooks.gate.settings import GateSettings, sized_for
from storage import experiments as store
from storage import memory_db
from storage.experiments import State
from tests.playbooks.experiments.test_engine_slots import (
    BASELINE,
    T0,
    FakeLauncher,
    deps_for,
    step,
)

TRIAL = ["--mem-fraction-static", "0.88"]
APPROVED_GATE = {"baseline_s": 900.0, "batch_s": 45.0, "scrape_s": 15.0, "min_effect": 0.05}


def test_the_approved_arguments_and_gate_settings_run_not_todays() -> None:
    db = memory_db()
    limiter = RestartLimiter(db, "g", 1, now=lambda: T0)
    launcher = FakeLauncher(limiter)
    deps = deps_for(db, limiter, launcher, "a")  # today's configuration: GateSettings()
    plan = machine.ApprovedPlan(tuple(BASELINE), tuple(TRIAL), APPROVED_GATE, plan_hash="abc")
    exp = machine.create(
        deps, {"mem_fraction_static": 0.88}, actor="u", approved_by="v", reason="t", plan=plan
    )
    row = store.get_experiment(db, exp)
    assert row.trial_config == {"args": TRIAL} and row.settings["plan_hash"] == "abc"
    settings = settings_of(row)
    assert (settings.baseline_s, settings.batch_s, settings.min_effect) == (900.0, 45.0, 0.05)
    assert step(deps, exp) == State.baseline
    for s in (State.restarting,):
        store.transition(db, exp, s, actor="t", reason="test", now=T0)
    assert step(deps, exp) == State.warming_up
    assert launcher.applied[0][0] == TRIAL


def test_a_plan_made_for_another_configuration_expires_untouched() -> None:
    db = memory_db()
    limiter = RestartLimiter(db, "g", 1, now=lambda: T0)
    launcher = FakeLauncher(limiter)
    deps = deps_for(db, limiter, launcher, "a")
    plan = machine.ApprovedPlan(
        ("--mem-fraction-static", "0.80"), tuple(TRIAL), APPROVED_GATE, plan_hash="abc"
    )
    exp = machine.create(
        deps, {"mem_fraction_static": 0.88}, actor="u", approved_by="v", reason="t", plan=plan
    )
    row = machine.advance(deps, exp).row
    assert row.state == State.expired
    moves = store.transitions(db, exp)
    assert moves[-1].details["cause"] == "stale_plan"
    assert "configuration changed since the approval" in moves[-1].reason
    assert launcher.applied == []  # nothing was touched
    end = ending(row, moves)
    assert end.outcome == Outcome.cancelled and end.cause_code == "stale_plan"


# one builder of the plan a person approves, for chat, the terminal and campaigns alike
GATE = GateSettings()


def test_the_plan_sizes_the_trial_for_the_predicted_gain() -> None:
    low = GATE.min_effect + 0.04
    assert low < GATE.planning_effect  # a gain smaller than the gate plans for by default
    plan = machine.ApprovedPlan.build(["--a", "1"], ["--a", "2"], GATE, (low, 0.3))
    assert plan.from_args == ("--a", "1") and plan.to_args == ("--a", "2")
    assert plan.gate == vars(sized_for(GATE, (low, 0.3)))
    assert plan.gate["planning_effect"] < GATE.planning_effect


def test_without_a_prediction_the_gate_is_the_servers() -> None:
    assert machine.ApprovedPlan.build(["--a"], ["--b"], GATE).gate == vars(GATE)
