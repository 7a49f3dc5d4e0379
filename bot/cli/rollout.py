"""`kvpilot rollout`: a change kept on one server of a group, rolled out to the rest.

`kvpilot rollout --from-experiment ID`: a change kept on one server of a group, rolled out to
the group's other servers with the same model and hardware, in the foreground.

The servers and the plan are the chat button's (`bot.chat.rollout.offer`); the person approves
them once (the confirmation, or `--yes`), as an approver (`[access]`; four-eyes: not the person
who proposed the change). Each server's step is an experiment with its own approval derived
from this one, carried here; the first not kept stops the rollout and reverts the servers it
changed. Ctrl-C stops the running steps (they revert) and so ends the rollout the same way. A
rollout this command left open (the terminal closed, the host restarted) is resumed by running
it again. Exit codes are `bot.cli.exit_codes`': 0 when every server kept the change, else the
code of the step that stopped it, 1 when a revert failed.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from datetime import UTC, datetime
from typing import Any, TextIO

from sqlite_utils import Database

from bot.app import claims
from bot.app.config import Config, ConfigError, load, warn_to
from bot.app.identity import terminal_actor
from bot.app.ticker import Ticker
from bot.app.wiring import database, experiment_deps, make_clock
from bot.chat.auth import Principal, authorise
from bot.chat.render import change_text
from bot.chat.rollout import offer
from bot.chat.surface import LOCAL_CHANNEL
from bot.cli import exit_codes
from bot.cli.chat import CHAT_IDS
from playbooks.clock import Clock
from playbooks.engines.base import EngineError
from playbooks.experiments import lifecycle
from playbooks.experiments.outcome import ending
from playbooks.experiments.ownership import Lease, this_process
from playbooks.experiments.rollout_run import RolloutContext, advance_rollout
from playbooks.launchers.base import LaunchError
from storage import audit
from storage import experiments as store
from storage import proposals as proposal_store
from storage import rollouts as rollout_store
from storage.errors import NotFound, StorageError


def cmd_rollout(ns: argparse.Namespace, out: TextIO, err: TextIO, stdin: TextIO) -> int:
    try:
        config = load(ns.config, warn=warn_to(err), ids=CHAT_IDS)
        db = database(config, any_thread=True)
    except (ConfigError, StorageError) as exc:
        err.write(f"error: {exc}\n")
        return exit_codes.USAGE
    try:
        with claims.held(config, "run `kvpilot rollout`"):
            return _rollout(ns, config, db, out, err, stdin)
    except (ConfigError, StorageError) as exc:  # another bot holds a server; no claims file
        err.write(f"error: {exc}\n")
        return exit_codes.USAGE


def _rollout(
    ns: argparse.Namespace, config: Config, db: Database, out: TextIO, err: TextIO, stdin: TextIO
) -> int:
    clock = make_clock(config, db)
    try:
        row = store.get_experiment(db, ns.from_experiment)
    except NotFound:
        err.write(f"error: no experiment {ns.from_experiment}; `kvpilot experiments list` shows "
                  "them\n")  # fmt: skip
        return exit_codes.USAGE
    who = terminal_actor()
    refused = _refusal(config, db, row, who)
    if refused is not None:
        err.write(f"error: refused: {refused}\n")
        return exit_codes.USAGE
    rollout_id = _open_or_new(ns, config, db, clock, row, who, err, stdin)
    if isinstance(rollout_id, str):
        return int(rollout_id)
    return _carry(config, db, clock, rollout_id, who, out, err, ns.json)


def _refusal(config: Config, db: Database, row: store.ExperimentRow, who: str) -> str | None:
    """Who may approve a proposal may approve a rollout; four-eyes: not its change's proposer."""
    proposer = None
    if row.proposal_id is not None:
        proposer = proposal_store.get_proposal(db, row.proposal_id).created_by
    decision = authorise(config.access, Principal(who, LOCAL_CHANNEL), "approve",
                         group_members=lambda _g: frozenset(), proposer=proposer)  # fmt: skip
    if decision.allowed:
        return None
    audit.record(db, audit.AccessDenied(
        actor=who, created=datetime.now(UTC), action="approve", reason=decision.reason,
        channel=LOCAL_CHANNEL, server=row.server, experiment_id=row.id,
    ))  # fmt: skip
    return decision.reason


def _open_or_new(
    ns: argparse.Namespace, config: Config, db: Database, clock: Clock,
    row: store.ExperimentRow, who: str, err: TextIO, stdin: TextIO,
) -> int | str:  # fmt: skip
    """The rollout to carry: one left open from this experiment, or a new one approved now;
    an exit code (as text) when there is none."""
    from bot.cli.experiments import confirm  # noqa: PLC0415 - the experiment commands' prompt

    left = [r for r in rollout_store.rollouts_from(db, row.id) if not r.over]
    if left:
        err.write(f"rollout {left[0].id} from experiment {row.id} was left open: resuming it\n")
        return left[0].id
    try:
        found = offer(config, db, row, clock)
    except (ConfigError, EngineError, LaunchError) as exc:
        err.write(f"error: {exc}\n")
        return str(exit_codes.USAGE)
    for name, why in found.left_out:
        err.write(f"  left out {name}: {why}\n")
    if found.plan is None:
        err.write(f"error: nothing to roll out from experiment {row.id}: {found.reason}\n")
        return str(exit_codes.USAGE)
    plan = found.plan
    err.write(f"roll out {change_text(dict(plan.change))} (kept on {plan.source_server} by "
              f"experiment {row.id}) to group {plan.group}, {plan.batch} at a time:\n")  # fmt: skip
    for s in plan.servers:
        err.write(f"  {s.server}: {' '.join(s.from_args)}\n    -> {' '.join(s.to_args)}\n")
    declined = confirm(
        ns.yes, stdin, err,
        "Roll out? Each server is measured by the gate; the first not kept stops the rollout "
        "and reverts the servers it changed.",
        "not rolled out; nothing changed",
    )  # fmt: skip
    if declined is not None:
        return str(declined)
    try:
        rollout = rollout_store.start_rollout(
            db, group=plan.group, source_experiment_id=row.id, plan=plan.to_json(),
            approved_by=who, now=clock.utcnow(),
        )  # fmt: skip
    except rollout_store.RolloutOpen as exc:
        err.write(f"error: {exc}\n")
        return str(exit_codes.USAGE)
    audit.record(db, audit.Note(
        actor=who, created=clock.utcnow(), server=row.server, experiment_id=row.id,
        text=f"rollout {rollout.id} approved by {who}"
        f"{' with --yes' if ns.yes else ' in the terminal'}: {change_text(dict(plan.change))} on "
        f"{', '.join(s.server for s in plan.servers)} (plan {rollout.plan_hash[:12]})",
    ))  # fmt: skip
    return rollout.id


def _carry(
    config: Config, db: Database, clock: Clock, rollout_id: int, who: str, out: TextIO,
    err: TextIO, as_json: bool,
) -> int:  # fmt: skip
    """Carry the rollout here until it ends; its steps' experiments on this process's ticker."""
    ticker = Ticker(clock)
    carried: set[int] = set()
    lock = threading.Lock()

    def say(text: str) -> None:
        err.write(f"  {text}\n")
        err.flush()

    def carry(step: rollout_store.StepRow) -> None:
        exp_id = step.experiment_id
        assert exp_id is not None
        with lock:
            if exp_id in carried:
                return
            lease = Lease(lambda: database(config), exp_id)
            if not lease.acquire():
                return  # another living process carries it; the rollout waits for its end
            carried.add(exp_id)
        # a connection of its own: the ticker's threads take its steps next to this loop
        own = database(config, any_thread=True)
        deps = experiment_deps(config, step.server, own, say, clock=clock)
        deps.lease = lease

        def ended(_row: object, _error: BaseException | None) -> None:
            lease.release()
            deps.client.close()
            own.close()
            with lock:
                carried.discard(exp_id)

        ticker.carry(exp_id, deps, ended)

    ctx = RolloutContext(
        db=db, deps_for=lambda s: experiment_deps(config, s, db, say, clock=clock), carry=carry,
        say=say, now=clock.utcnow, owner=str(this_process()),
    )  # fmt: skip
    stopping = _StopOnSignal(ctx, rollout_id, who)
    try:
        with stopping:
            while (delay := advance_rollout(ctx, rollout_id)) is not None:
                clock.sleep(delay)
    finally:
        ticker.shutdown()
    return _report(db, rollout_id, out, as_json)


class _StopOnSignal:
    """Ctrl-C or SIGTERM: the running steps are aborted (they revert), which stops the rollout
    and reverts the servers it changed; the command carries that to its end."""

    def __init__(self, ctx: RolloutContext, rollout_id: int, who: str) -> None:
        self.ctx, self.rollout_id, self.who = ctx, rollout_id, who
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *_exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)

    def _handle(self, signum: int, _frame: object) -> None:
        sys.stderr.write(f"\n{signal.Signals(signum).name}: stopping rollout {self.rollout_id}; "
                         "its running steps revert, then the servers it changed\n")  # fmt: skip
        row = rollout_store.get_rollout(self.ctx.db, self.rollout_id)
        why = f"rollout {self.rollout_id} stopped by {self.who}"
        for step in row.steps:
            if step.kind != "apply" or step.experiment_id is None:
                continue
            exp = store.get_experiment(self.ctx.db, step.experiment_id)
            if exp.terminal:
                continue
            deps = self.ctx.deps_for(exp.server)
            try:
                lifecycle.abort(deps, exp.id, actor=self.who, reason=why)
            finally:
                deps.client.close()


def _report(db: Database, rollout_id: int, out: TextIO, as_json: bool) -> int:
    row = rollout_store.get_rollout(db, rollout_id)
    steps, codes = [], []
    for step in row.steps:
        item: dict[str, Any] = {"server": step.server, "kind": step.kind, "status": step.status}
        if step.kind == "apply" and step.experiment_id is not None:
            exp = store.get_experiment(db, step.experiment_id)
            end = ending(exp, store.transitions(db, exp.id))
            item.update(experiment=exp.id, state=str(exp.state), outcome=str(end.outcome),
                        cause=end.cause)  # fmt: skip
            codes.append(exit_codes.BY_OUTCOME[end.outcome])
        steps.append(item)
    code = exit_codes.OK
    if row.outcome == "failed":
        code = exit_codes.FAILED
    elif row.outcome != "done":
        code = exit_codes.most_urgent([c for c in codes if c != exit_codes.OK]) or exit_codes.FAILED
    if as_json:
        out.write(json.dumps({"rollout": row.id, "group": row.group, "outcome": row.outcome,
                              "reason": row.reason, "source_experiment": row.source_experiment_id,
                              "steps": steps, "exit_code": code}) + "\n")  # fmt: skip
        return code
    out.write(f"rollout {row.id} ({row.group}): {row.outcome}: {row.reason}\n")
    for s in steps:
        what = f"experiment {s['experiment']}: {s['state']}" if "experiment" in s else s["status"]
        out.write(f"  {s['server']} {s['kind']}: {what}\n")
    return code
