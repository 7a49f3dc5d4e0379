"""Someone changes the server's configuration behind kvpilot's back: kvpilot leaves it as they
set it, on the incident twin behind the process launcher."""

from __future__ import annotations

from pathlib import Path

from bot.app.config import load
from bot.app.wiring import database, experiment_deps, make_clock
from bot.app.wiring import launcher as wiring_launcher
from bot.cli.experiment_summary import summarise
from playbooks.clock import WallClock
from playbooks.experiments import machine
from playbooks.launchers.base import ServerIdentity
from storage import audit, servers
from storage import experiments as store
from tests.playbooks.experiments.incident import SCALE, incident_workspace


def test_a_change_made_by_hand_during_the_trial_is_left_as_it_was_set(tmp_path: Path) -> None:
    with incident_workspace(tmp_path, SCALE) as ws:
        config = load(str(ws.config))
        db = database(config)
        # the operator's own tool: a fresh launcher on the same server, not kvpilot's
        person = wiring_launcher(config, config.server("incident"), WallClock())
        theirs: list[str] = []
        after_their_change: list[ServerIdentity | None] = []

        def on_progress(note: str) -> None:
            # the gate's first look in the trial: the change is measured, samples are stored
            if note.startswith("trial ") and not theirs:
                args = deps.client.engine.with_change(
                    person.current_args(), {"mem_fraction_static": 0.80}
                )
                person.apply(args)
                theirs.extend(args)
                after_their_change.append(person.identity())

        deps = experiment_deps(config, "incident", db, on_progress, clock=make_clock(config, db))
        try:
            exp = machine.create(
                deps, {"mem_fraction_static": 0.88}, actor="cli:test", approved_by="cli:test",
                reason="approved with --yes",
            )  # fmt: skip
            row = machine.run(deps, exp)
            assert theirs, "the experiment never reached a look in the trial"
            assert ws.info()["mem_fraction_static"] == 0.80  # their configuration runs
            assert person.identity() == after_their_change[0]  # and nobody restarted it since
        finally:
            deps.launcher.stop()
            person.stop()
            deps.client.close()
        assert str(row.state) == "superseded", store.transitions(db, exp)[-1].reason
        last = store.transitions(db, exp)[-1]
        assert last.from_state == "trial" and last.details["cause"] == "superseded"
        assert "changed outside kvpilot during the experiment" in last.reason
        assert " ".join(theirs) in last.reason
        summary = summarise(db, row)
        assert summary["outcome"] == "superseded" and summary["exit_code"] == 8
        names = [e["name"] for e in audit.events(db, experiment_id=exp)]
        assert names.count("restart_started") == 1  # the trial's restart, before their change
        assert "revert_executed" not in names
        assert names.index("restart_started") < names.index("config_changed_outside")
        current = servers.current_config(db, "incident")
        good = servers.last_known_good(db, "incident")
        assert current is not None and good is not None
        assert current.args == good.args == {"args": theirs}
        assert current.note is not None and "changed outside kvpilot" in current.note
