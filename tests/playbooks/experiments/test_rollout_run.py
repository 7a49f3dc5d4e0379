"""A rollout step's derived approval runs out by the wall clock, as every approval does, even
when the rollout and its experiments run on a twin's clock hours ahead of it: a freeze that
holds the step is judged against an approval end on the same clock."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from playbooks.experiments import holds, machine
from playbooks.experiments.restart_limits import RestartLimiter
from playbooks.experiments.rollout import Plan, ServerPlan
from playbooks.experiments.rollout_run import RolloutContext, advance_rollout
from storage import experiments as store
from storage import memory_db, proposals
from storage import rollouts as rollout_store
from storage.experiments import State
from tests.playbooks.experiments.test_engine_slots import BASELINE, FakeLauncher, deps_for

WALL = datetime(2026, 12, 6, 0, 24, tzinfo=UTC)  # the calendar's time now
AHEAD = WALL + timedelta(hours=11)  # the twin's clock, after hours at 200x
TRIAL = ["--mem-fraction-static", "0.88"]
FREEZE = holds.Hold("group `kimi` frozen by U1 until 2026-12-06 02:24 UTC", None)


def test_a_held_rollout_step_expires_an_hour_after_it_started_on_the_wall_clock() -> None:
    db = memory_db()
    wall = [WALL]
    launcher = FakeLauncher(RestartLimiter(db, "kimi", 1, now=lambda: WALL))
    deps = replace(
        deps_for(db, launcher.limiter, launcher, "b"),
        now=lambda: AHEAD,
        hold=lambda _at: FREEZE,
        wall_now=lambda: wall[0],
    )
    plan = Plan("kimi", 1, "a", {"mem_fraction_static": 0.88},
                (ServerPlan("b", tuple(BASELINE), tuple(TRIAL)),), 1, {})  # fmt: skip
    rollout = rollout_store.start_rollout(
        db, group="kimi", source_experiment_id=1, plan=plan.to_json(), approved_by="U2", now=AHEAD
    )
    carried: list[int] = []
    ctx = RolloutContext(
        db=db, deps_for=lambda _server: deps, carry=lambda s: carried.append(s.experiment_id or 0),
        say=lambda _text: None, now=lambda: AHEAD, owner="bot-1", wall_now=lambda: wall[0],
    )  # fmt: skip
    advance_rollout(ctx, rollout.id)
    (exp_id,) = carried
    exp = store.get_experiment(db, exp_id)
    assert exp.proposal_id is not None
    assert proposals.get_proposal(db, exp.proposal_id).expires_at == WALL + timedelta(hours=1)

    # frozen: the step waits, its approval's end stored on the wall clock for the front ends
    assert machine.advance(deps, exp_id).row.state == State.approved
    stored = store.get_experiment(db, exp_id).progress
    assert stored[holds.APPROVAL_UNTIL] == (WALL + timedelta(hours=1)).timestamp()
    wall[0] = WALL + timedelta(minutes=59)
    assert machine.advance(deps, exp_id).row.state == State.approved
    wall[0] = WALL + timedelta(hours=1)  # the derived approval's end, still frozen
    assert machine.advance(deps, exp_id).row.state == State.expired
