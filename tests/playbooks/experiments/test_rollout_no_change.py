"""A rollout skips a server that already runs the change (set by hand since the offer, or
spelt otherwise): a line says so, nothing is restarted there, and the rollout goes on."""

from __future__ import annotations

from playbooks.experiments.restart_limits import RestartLimiter
from playbooks.experiments.rollout import Plan, ServerPlan
from playbooks.experiments.rollout_run import RolloutContext, advance_rollout
from storage import audit, memory_db
from storage import experiments as store
from storage import rollouts as rollout_store
from tests.playbooks.experiments.test_engine_slots import T0, FakeLauncher, deps_for

BEFORE = ["--mem-fraction-static", "0.85"]
AFTER = ["--mem-fraction-static", "0.88"]


def test_a_server_that_already_runs_the_change_is_skipped_without_a_restart() -> None:
    db = memory_db()
    limiter = RestartLimiter(db, "kimi", 1, now=lambda: T0)
    # b was set to 0.88 by hand (spelt 0.880) after the offer; c still runs 0.85
    launchers = {
        "b": FakeLauncher(limiter, args=["--mem-fraction-static", "0.880"]),
        "c": FakeLauncher(limiter, args=list(BEFORE)),
    }
    plan = Plan(
        "kimi", 1, "a", {"mem_fraction_static": 0.88},
        tuple(ServerPlan(s, tuple(BEFORE), tuple(AFTER)) for s in ("b", "c")), 1, {},
    )  # fmt: skip
    rollout = rollout_store.start_rollout(
        db, group="kimi", source_experiment_id=1, plan=plan.to_json(), approved_by="U2", now=T0
    )
    said: list[str] = []
    carried: list[str] = []
    ctx = RolloutContext(
        db=db,
        deps_for=lambda server: deps_for(db, limiter, launchers[server], server),
        carry=lambda step: carried.append(step.server),
        say=said.append,
        now=lambda: T0,
        owner="test",
    )

    assert advance_rollout(ctx, rollout.id) == 0.0  # b: skipped
    row = rollout_store.get_rollout(db, rollout.id)
    step = row.step("b", "apply")
    assert step is not None and step.status == "skipped" and step.experiment_id is None
    assert store.list_experiments(db, "b") == [] and carried == []
    assert launchers["b"].starts == 0 and launchers["b"].applied == []  # not restarted
    (line,) = said
    assert line.startswith(f"rollout {rollout.id}: b skipped: nothing would change on `b`: ")
    assert "mem_fraction_static is already 0.88 (`--mem-fraction-static 0.880`" in line
    notes = [e["properties"]["text"] for e in audit.events(db, name="note")]
    assert line in notes

    advance_rollout(ctx, rollout.id)  # c: its experiment starts as any step's does
    assert carried == ["c"] and len(store.list_experiments(db, "c")) == 1
