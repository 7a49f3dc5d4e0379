"""`kvpilot tune`: a campaign in the foreground, one gated experiment after another.

The server is diagnosed once; after that, each verdict's own window is assessed again, so no
step needs an extra measurement. With `--allow KEY=RANGE`, the person approves a bounded plan
once (those arguments in those ranges, at most `--max-experiments` restarts, stopping at the
first change not kept) and the steps inside it run without asking; without `--allow`, each
step is asked for (or taken with `--yes`). A step that runs the server out of memory teaches a
bound that is never proposed again for that server without `--force` (a start still loading at
the ready timeout teaches nothing). Every step is an experiment like
`kvpilot experiment`'s: recorded, leased, reverted on Ctrl-C, judged by the gate.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from typing import Any, TextIO

from sqlite_utils import Database

from bot.app.config import Config
from bot.app.identity import terminal_actor
from bot.app.wiring import diagnose_settings, experiment_deps, room_after, room_before
from bot.cli import exit_codes
from bot.cli.experiment_summary import summarise
from bot.cli.experiments import (
    Command,
    _printer,
    carry,
    confirm,
    four_eyes,
    resume_unfinished,
)
from playbooks.campaigns import after
from playbooks.campaigns.cutdown import Reassess
from playbooks.campaigns.policy import (
    Allowance,
    Choice,
    PolicyError,
    Tried,
    Unchanged,
    campaign_stop,
    choose_next,
)
from playbooks.campaigns.room import RoomBefore
from playbooks.clock import Clock
from playbooks.diagnose.measure import MeasurementError, measurement_of
from playbooks.diagnose.playbook import diagnose
from playbooks.engines.base import ArgError, EngineClient, Snapshot
from playbooks.engines.types import Option
from playbooks.experiments import machine, no_change
from playbooks.experiments.ownership import Lease
from playbooks.experiments.sampling import store_scrapes
from storage import campaigns as campaign_store
from storage import experiments as store


@dataclass
class Campaign:
    """What the terminal run has done so far (printed at the end)."""

    id: int
    server: str
    allowance: Allowance
    steps: list[dict[str, Any]] = field(default_factory=list)
    tried: list[Tried] = field(default_factory=list)
    codes: list[int] = field(default_factory=list)
    stop: str = ""
    # the GPUs' room before the step now running: what a kept step's smaller chunk is
    # measured against (`playbooks.campaigns.room`)
    room_before: RoomBefore | None = None


def cmd_tune(cmd: Command) -> int:
    ns, config, db, clock, out, err = cmd.ns, cmd.config, cmd.db, cmd.clock, cmd.out, cmd.err
    server = config.server(ns.server)
    if four_eyes(config):
        err.write(
            "error: four-eyes is on ([access] four_eyes): a campaign's steps need another "
            "person's approval; propose them one by one with `kvpilot experiment run` or in "
            "chat\n"
        )
        return exit_codes.USAGE
    try:
        allowance = Allowance.parse(
            ns.allow, ns.max_experiments, stop_at_first_not_kept=bool(ns.allow)
        )
    except PolicyError as exc:
        raise ArgError(str(exc)) from None
    deps = experiment_deps(config, ns.server, db, _printer(err), clock=clock)
    try:
        _check_keys(deps.client, allowance)
        resume_unfinished(config, db, clock, err, server=ns.server)
        active = [e for e in store.active_experiments(db) if e.server == ns.server]
        if active:
            err.write(
                f"error: experiment {active[0].id} on {ns.server} is still {active[0].state}; "
                f"wait for it or abort it (`kvpilot experiments abort {active[0].id}`)\n"
            )
            return exit_codes.USAGE
        who = terminal_actor()
        if allowance.ranges:
            err.write(f"plan for {ns.server}: {allowance.text()}\n")
            refused = confirm(
                ns.yes,
                cmd.stdin,
                err,
                "Approve this plan? Each step is still measured and reverted unless it helps.",
                "plan not approved; nothing changed",
            )
            if refused is not None:
                return refused
        row = campaign_store.start_campaign(
            db,
            server=ns.server,
            plan=allowance.to_json(),
            created_by=who,
            approved_by=who if allowance.ranges else None,
            now=deps.now(),
        )
        run = Campaign(row.id, ns.server, allowance)
        try:
            options, reassess = _diagnose(deps.client, clock, server, db, ns.server, err)
            choice = choose_next(
                options,
                tried=after.history_of(db, ns.server),
                bounds=after.bounds_of(db, ns.server),
                allowance=allowance if allowance.ranges else None,
                force=ns.force,
                reassess=reassess,
                unchanged=_unchanged(deps),
            )
            _run_steps(ns, config, db, clock, run, choice, err, cmd.stdin)
        except BaseException as exc:  # recorded as the campaign's end, then raised on
            run.stop = run.stop or f"stopped by an error: {exc}"
            raise
        finally:
            campaign_store.end_campaign(db, run.id, run.stop, actor=who, now=deps.now())
    finally:
        deps.client.close()
    _print(run, ns.json, out)
    return _exit_code(run)


def _run_steps(
    ns: argparse.Namespace,
    config: Config,
    db: Database,
    clock: Clock,
    run: Campaign,
    choice: Choice,
    err: TextIO,
    stdin: TextIO,
) -> None:
    """Take steps until the policy, the plan or the person stops the campaign."""
    who = terminal_actor()
    while True:
        for title, why in choice.skipped:
            err.write(f"  passed over {title}: {why}\n")
        stop = campaign_stop(run.tried, run.allowance)
        if stop is None and choice.option is None:
            stop = choice.stop
        if stop is not None:
            run.stop = stop
            return
        assert choice.option is not None
        option = choice.option
        err.write(_step_text(len(run.tried) + 1, option))
        if not run.allowance.ranges:
            refused = confirm(
                ns.yes, stdin, err, "Run this step?", "step declined; the campaign ends"
            )
            if refused is not None:
                run.stop = (
                    "no terminal to ask about the next step: re-run with --yes, or approve a "
                    "plan with --allow KEY=RANGE"
                    if refused == exit_codes.USAGE
                    else "a person declined the next step"
                )
                run.codes.append(refused)
                return
        exp = _experiment(config, db, clock, run, option, who, err)
        if exp is None:
            run.stop = "the step could not be carried to its end by this process"
            return
        nxt = _after_step(ns, config, db, clock, run, exp, err)
        if nxt is None:
            return
        choice = nxt


def _after_step(
    ns: argparse.Namespace,
    config: Config,
    db: Database,
    clock: Clock,
    run: Campaign,
    exp: store.ExperimentRow,
    err: TextIO,
) -> Choice | None:
    """Learn from the step, keep a kept trial's window for the next baseline, choose again
    (None: the campaign stops, `run.stop` says why)."""
    deps = experiment_deps(config, run.server, db, _printer(err), clock=clock)
    try:
        for bound in after.learn(
            db, exp, deps.client.engine, actor=terminal_actor(), now=deps.now()
        ):
            err.write(f"  learnt: {bound.text()}\n")
        run.tried = after.tried_of(db, [s["id"] for s in run.steps])
        if exp.state in (store.State.failed, store.State.superseded, store.State.cancelled):
            run.stop = f"experiment {exp.id} ended {exp.state}"
            return None
        return after.next_after(
            db,
            exp,
            deps.client,
            diagnose_settings(config.server(run.server)),
            tried=run.tried,
            allowance=run.allowance if run.allowance.ranges else None,
            force=ns.force,
            # the memory the kept server leaves free as it runs: evidence for a step past the
            # engine's reserve (a server just restarted by a revert has not run under load)
            room=room_after(config.server(run.server), deps.client, run.room_before)
            if exp.state == store.State.kept
            else None,
            unchanged=_unchanged(deps),
        ).choice
    finally:
        deps.client.close()


def _experiment(
    config: Config,
    db: Database,
    clock: Clock,
    run: Campaign,
    option: Option,
    who: str,
    err: TextIO,
) -> store.ExperimentRow | None:
    """One step, carried to its end here; its row (None if another process took it over)."""
    deps = experiment_deps(config, run.server, db, _printer(err), clock=clock)
    baseline = deps.launcher.current_args()
    where = no_change.launcher_words(deps.launcher.kind)
    trial = no_change.trial_args(deps.client.engine, run.server, baseline, option.change, where)
    lease = Lease(lambda: engine_db(config))
    reason = (
        f"step {len(run.tried) + 1} of campaign {run.id}, inside its plan approved by {who}"
        if run.allowance.ranges
        else f"step {len(run.tried) + 1} of campaign {run.id}, confirmed in the terminal"
    )
    run.room_before = room_before(config.server(run.server), deps.client, option)
    exp_id = machine.create(
        deps,
        dict(option.change),
        actor=who,
        approved_by=who,
        reason=reason,
        owner=lease,
        plan=machine.ApprovedPlan.build(baseline, trial, deps.gate, option.predicted_gain),
    )
    campaign_store.add_step(db, run.id, exp_id, now=deps.now())
    if not carry(deps, lease, err):
        return None
    row = store.get_experiment(db, exp_id)
    summary = summarise(db, row)
    summary["predicted_throughput_change"] = option.to_json()["predicted_throughput_change"]
    run.steps.append(summary)
    run.codes.append(int(summary["exit_code"]))
    err.write(f"  experiment {exp_id}: {summary['outcome']} ({summary['cause']})\n")
    return row


def _unchanged(deps: machine.Deps) -> Unchanged:
    """Which changes the server already runs, as its launcher says now: passed over."""
    where = no_change.launcher_words(deps.launcher.kind)
    current = deps.launcher.current_args()
    return no_change.unchanged_by(deps.client.engine, deps.server, current, where)


def engine_db(config: Config) -> Database:
    from bot.app.wiring import database  # noqa: PLC0415 - a fresh connection for the lease

    return database(config)


def _diagnose(
    client: EngineClient, clock: Clock, server: Any, db: Database, name: str, err: TextIO
) -> tuple[list[Option], Reassess | None]:
    """The campaign's one measurement: the server as it runs now, stored so the first step
    can take it as its baseline; its options, and the rules asked again against it."""
    err.write(f"diagnosing {name} ...\n")
    scrapes: list[Snapshot] = []
    settings = diagnose_settings(server)
    try:
        finding = diagnose(
            client,
            clock,
            settings,
            on_sample=lambda s: scrapes.append(s.at(clock.utcnow().timestamp())),
        )
    except MeasurementError as exc:
        raise ArgError(f"{name} could not be measured: {exc}") from None
    store_scrapes(db, name, scrapes)
    err.write(f"  bottleneck: {finding.bottleneck}\n")
    try:
        m = measurement_of(scrapes, settings.plan, why="the campaign's diagnosis")
        reassess: Reassess | None = after.reassessor(client.engine, client.settings(), settings, m)
    except (MeasurementError, ValueError):
        reassess = None  # the window cannot be judged again: only its own options are
    return finding.options, reassess


def _check_keys(client: EngineClient, allowance: Allowance) -> None:
    allowed = client.engine.allowed_args()
    for key in allowance.ranges:
        if key not in allowed:
            known = ", ".join(sorted(allowed))
            raise ArgError(f"--allow {key}: not an argument kvpilot may change (it may: {known})")


def _step_text(n: int, option: Option) -> str:
    change = " ".join(f"{k}={v}" for k, v in option.change.items())
    gain = ""
    if option.predicted_gain is not None:
        low, high = option.predicted_gain
        gain = f", predicted throughput {low:+.0%}..{high:+.0%}"
    return f"step {n}: {change} ({option.verdict}{gain})\n"


def _exit_code(run: Campaign) -> int:
    """0 when every step ended on a known-good configuration (kept or reverted: that is what
    a campaign does); otherwise the most urgent of failed, cancelled and superseded."""
    serious = [
        c
        for c in run.codes
        if c in (exit_codes.FAILED, exit_codes.CANCELLED, exit_codes.SUPERSEDED)
    ]
    if not serious and exit_codes.USAGE in run.codes:
        return exit_codes.USAGE  # nobody could be asked about a step: how it was run was wrong
    return exit_codes.most_urgent(serious)


def _print(run: Campaign, as_json: bool, out: TextIO) -> None:
    kept = [s for s in run.steps if s["outcome"] == "kept"]
    if as_json:
        data = {
            "campaign": run.id,
            "server": run.server,
            "plan": run.allowance.to_json(),
            "steps": run.steps,
            "kept": [s["change"] for s in kept],
            "stop": run.stop,
        }
        out.write(json.dumps(data) + "\n")
        return
    out.write(f"campaign {run.id} on {run.server}: {len(run.steps)} step(s), {len(kept)} kept\n")
    for s in run.steps:
        change = " ".join(f"{k}={v}" for k, v in s["change"].items())
        out.write(f"  experiment {s['id']}: {change}: {s['outcome']} ({s['cause']})\n")
    out.write(f"stopped: {run.stop}\n")
