"""`kvpilot experiment`, `kvpilot experiments list|show|abort|approve|reject`, `kvpilot resume`.

An experiment started here runs in the foreground: this process holds its lease (one process
at a time carries an experiment), Ctrl-C or SIGTERM aborts and reverts it, and the exit status
says how it ended (`bot.exit_codes`). With four-eyes on, the change is recorded as a proposal
that another person must approve, in Slack or with `kvpilot experiments approve ID`.

Why it is long: every `kvpilot experiment(s)` subcommand shares the terminal's approval, lease
and carry-to-the-end code kept here.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from sqlite_utils import Database

from bot.app import claims
from bot.app.config import Config, ConfigError, load
from bot.app.identity import terminal_actor
from bot.app.interrupts import StopOnSignal
from bot.app.ticker import Ticker
from bot.app.wiring import database, experiment_deps, make_clock
from bot.app.wiring import engine as engine_of
from bot.app.wiring import launcher as wiring_launcher
from bot.chat.auth import Principal
from bot.chat.decisions import Reason, Refusal
from bot.chat.flow import rules_to_judge
from bot.chat.render import change_text
from bot.chat.surface import LOCAL_CHANNEL
from bot.cli import access, exit_codes
from bot.cli.chat import CHAT_IDS
from bot.cli.experiment_summary import cmd_list, cmd_show, report
from playbooks.campaigns import after
from playbooks.clock import Clock
from playbooks.engines.base import ArgError, EngineError
from playbooks.experiments import machine, no_change
from playbooks.experiments.outcome import ending
from playbooks.experiments.ownership import Lease, OwnershipLost
from playbooks.launchers.base import LaunchError
from storage import audit
from storage import experiments as store
from storage import proposals as proposal_store
from storage.db import fault, path_of
from storage.errors import NotFound, StorageError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = exit_codes.OK, exit_codes.FAILED, exit_codes.USAGE


def _printer(err: TextIO) -> Callable[[str], None]:
    def say(message: str) -> None:
        err.write(f"  {message}\n")
        err.flush()

    return say


@dataclass(frozen=True)
class Command:
    """One `kvpilot experiment(s)` or `tune` run as `dispatch` hands it to its subcommand: the
    parsed arguments, the configuration and database, this process's one clock, the terminal."""

    ns: argparse.Namespace
    config: Config
    db: Database
    clock: Clock
    out: TextIO
    err: TextIO
    stdin: TextIO


ACTIONS_USAGE = "kvpilot experiment list|show ID|abort ID|approve ID|reject ID"


def dispatch(ns: argparse.Namespace, out: TextIO, err: TextIO, stdin: TextIO) -> int:
    if ns.command == "experiments" and getattr(ns, "action", None) is None:
        err.write(f"error: name an action: `{ACTIONS_USAGE}`\n")
        return EXIT_USAGE
    try:
        config = load(ns.config, ids=CHAT_IDS)
        # the scheduler's threads take the steps of a foreground experiment on this connection
        db = database(config, any_thread=True)
    except (ConfigError, StorageError) as exc:
        err.write(f"error: {exc}\n")
        return EXIT_USAGE
    refused = access.refusal(config, db, ns, err)
    if refused is not None:
        err.write(f"error: refused: {refused}\n")
        return EXIT_USAGE
    try:
        with claims.held(config, *claimed(ns, config)):
            return _run(Command(ns, config, db, make_clock(config, db), out, err, stdin))
    except no_change.NothingToChange as exc:
        err.write(f"refused: {exc}; nothing was done\n")
        return exit_codes.NOTHING_TO_CHANGE
    except (ConfigError, ArgError) as exc:
        err.write(f"error: {exc}\n")
        return EXIT_USAGE
    except LaunchError as exc:
        err.write(launch_error_text(exc))
        return EXIT_FAILED
    except (EngineError, StorageError) as exc:
        err.write(f"error: {exc}\n")
        return EXIT_FAILED
    except sqlite3.Error as exc:
        err.write(f"error: {fault(exc, path_of(db))}\n")
        return EXIT_FAILED


def claimed(ns: argparse.Namespace, config: Config) -> tuple[str, list[str] | None]:
    """What a command claims while it runs (`bot.app.claims.held`): the server it changes, or
    every configured server where the experiments it carries are found only as it runs; a
    command that only reads claims nothing."""
    doing = f"run `kvpilot {ns.command}{' ' + ns.action if ns.command == 'experiments' else ''}`"
    if ns.command == "experiments" and ns.action not in ("abort", "approve"):
        return doing, []
    if ns.command == "server" and ns.action == "status":
        return doing, []
    if ns.command in ("experiment", "tune", "server"):
        return doing, [ns.server] if ns.server in config.servers else []
    return doing, None


def _run(cmd: Command) -> int:
    ns, config, db, clock, out, err = cmd.ns, cmd.config, cmd.db, cmd.clock, cmd.out, cmd.err
    if ns.command == "experiment":
        return cmd_experiment(cmd)
    if ns.command == "server":
        return cmd_server(ns, config, clock, out, err)
    if ns.command == "tune":
        from bot.cli.tune import cmd_tune  # noqa: PLC0415 - tune builds on this module

        return cmd_tune(cmd)
    if ns.command == "resume":
        codes = resume_unfinished(config, db, clock, err)
        out.write(f"{len(codes)} unfinished experiment(s) handled\n")
        return exit_codes.most_urgent(codes)
    return experiments_action(cmd)


def experiments_action(cmd: Command) -> int:
    ns, config, db, clock, out, err = cmd.ns, cmd.config, cmd.db, cmd.clock, cmd.out, cmd.err
    if ns.action == "list":
        return cmd_list(ns, db, out)
    if ns.action == "show":
        return cmd_show(ns, db, out, err)
    if ns.action == "abort":
        return cmd_abort(ns, config, db, clock, out, err)
    if ns.action in ("approve", "reject"):
        return cmd_decide(ns, config, db, clock, out, err, cmd.stdin)
    err.write(f"error: use `{ACTIONS_USAGE}`\n")
    return EXIT_USAGE


def launch_error_text(exc: LaunchError, lines: int = 15) -> str:
    """The reason, then the last lines of the server's log and where the whole log is."""
    text = f"error: {exc.reason}\n"
    tail = [line for line in exc.log_tail.splitlines() if line.strip()][-lines:]
    if tail:
        where = f" of {exc.log_path}" if exc.log_path else ""
        text += f"last {len(tail)} lines{where}:\n" + "".join(f"  {line}\n" for line in tail)
    elif exc.log_path:
        text += f"the log ({exc.log_path}) is empty\n"
    return text


def resume_unfinished(
    config: Config, db: Database, clock: Clock, err: TextIO, server: str | None = None
) -> list[int]:
    """Every experiment a crash left active is resumed where safe, reverted otherwise.

    An experiment another living kvpilot process carries is left to it. Returns the exit code
    of each experiment this process finished.
    """

    def resume(row: store.ExperimentRow, lease: Lease) -> int | None:
        deps = experiment_deps(config, row.server, db, _printer(err), clock=clock)
        err.write(f"resuming experiment {row.id} on {row.server} (was {row.state})\n")
        if not carry(deps, lease, err, resume=True):
            return None
        final = store.get_experiment(db, row.id)
        err.write(f"experiment {row.id}: {final.state}\n")
        return exit_code(db, final)

    codes = machine.resume_unfinished(
        db,
        lambda exp_id: Lease(lambda: database(config), exp_id),
        resume,
        server=server,
        carried_elsewhere=lambda lease: _say_carried_elsewhere(lease, err),
    )
    return [code for code in codes if code is not None]


def _say_carried_elsewhere(lease: Lease, err: TextIO) -> None:
    held_by, until = lease.holder()
    until_text = "" if until is None else f" (lease renewed until {until:%H:%M:%S} UTC)"
    err.write(
        f"experiment {lease.experiment_id} is being carried by another kvpilot process, "
        f"{held_by}{until_text}; left to it\n"
    )


def carry(deps: machine.Deps, lease: Lease, err: TextIO, *, resume: bool = False) -> bool:
    """Run the experiment to its end in the foreground, holding `lease` (already acquired).

    Its steps are taken by the process's scheduler (`bot.app.ticker`); this thread waits and
    takes Ctrl-C or SIGTERM, which aborts and reverts it. False when this process lost the
    experiment to another (it then touched nothing more).
    """
    deps.lease = lease
    exp_id = lease.experiment_id
    lost: list[BaseException] = []

    def ended(_row: store.ExperimentRow | None, error: BaseException | None) -> None:
        if error is not None:
            lost.append(error)

    ticker = Ticker(deps.clock)
    with StopOnSignal(terminal_actor(), err) as stop:
        stop.experiment_id = exp_id
        deps.interrupt = stop.take
        try:
            if resume:
                machine.resume_policy(deps, exp_id, actor="kvpilot")
            ticker.carry(exp_id, deps, ended)
            while not ticker.wait(exp_id, timeout=0.2):
                pass
        finally:
            ticker.shutdown()
            try:
                lease.release()
            except (sqlite3.Error, StorageError) as exc:  # it runs out on its own
                err.write(f"  experiment {exp_id}: could not give up its lease ({exc})\n")
            deps.client.close()
    if lost and isinstance(lost[0], OwnershipLost):
        err.write(f"experiment {exp_id}: this process stopped carrying it: {lost[0]}\n")
        return False
    if lost:
        row = store.get_experiment(deps.db, exp_id)  # a read: it works on a full disk
        err.write(
            f"experiment {exp_id}: left in {row.state}; once that is fixed, `kvpilot resume` "
            "carries it on\n"
        )
        raise lost[0]
    return True


def exit_code(db: Database, row: store.ExperimentRow) -> int:
    return exit_codes.BY_OUTCOME[ending(row, store.transitions(db, row.id)).outcome]


def confirm(yes: bool, stdin: TextIO, err: TextIO, question: str, declined: str) -> int | None:
    """None to go ahead; else the exit code. Without a terminal only `--yes` is a yes."""
    if yes:
        return None
    if not stdin.isatty():
        err.write("error: confirmation needed and there is no terminal: re-run with --yes\n")
        return EXIT_USAGE
    err.write(f"{question} [y/N] ")
    err.flush()
    if stdin.readline().strip().lower() in ("y", "yes"):
        return None
    err.write(declined + "\n")
    return EXIT_OK


def four_eyes(config: Config) -> bool:
    return config.access is not None and config.access.four_eyes


def cmd_experiment(cmd: Command) -> int:
    ns, config, db, clock, out, err = cmd.ns, cmd.config, cmd.db, cmd.clock, cmd.out, cmd.err
    server = config.server(ns.server)
    items = [item for group in ns.set for item in group]
    if not items:
        raise ArgError("nothing to change: give --set KEY=VALUE (e.g. mem_fraction_static=0.88)")
    change = engine_of(server).parse_change(items)
    resume_unfinished(config, db, clock, err, server=ns.server)
    if any(e.server == ns.server for e in store.active_experiments(db)):
        active = next(e for e in store.active_experiments(db) if e.server == ns.server)
        err.write(
            f"error: experiment {active.id} on {ns.server} is still {active.state}; wait for "
            f"it to finish or abort it (`kvpilot experiments abort {active.id}`)\n"
        )
        return EXIT_USAGE
    deps = experiment_deps(config, ns.server, db, _printer(err), clock=clock)
    baseline = deps.launcher.current_args()
    try:
        trial = no_change.trial_args(
            deps.client.engine, ns.server, baseline, change,
            no_change.launcher_words(deps.launcher.kind),
        )  # fmt: skip
    except ArgError:  # nothing to change, or a change the engine refuses: said by dispatch
        deps.client.close()
        raise
    info = deps.client.settings()
    rules = rules_to_judge(deps.client, info, server)
    option = rules.judge(change)
    err.write(f"server {ns.server} ({server.url}): change {option.title}\n")
    err.write(f"  from: {' '.join(baseline)}\n  to:   {' '.join(trial)}\n")
    if option.predicted_max_total_num_tokens is not None:
        err.write(
            f"  KV capacity {info.capacity_tokens:,} -> "
            f"{option.predicted_max_total_num_tokens:,} tokens (predicted)\n"
        )
    for reason in option.reasons:
        err.write(f"  - {reason}\n")
    if option.verdict == "unsafe" and not ns.force:
        err.write(
            "error: refused: the safety checks call this change unsafe (reasons above). "
            "Run with --force to try it anyway; it is reverted if the server fails.\n"
        )
        return EXIT_USAGE
    who = terminal_actor()
    if four_eyes(config):
        deps.client.close()
        return propose_for_approval(ns, config, clock, change, who, err)
    refused = confirm(
        ns.yes,
        cmd.stdin,
        err,
        "Apply this change, measure it, and keep it only if throughput improves?",
        "not applied",
    )
    if refused is not None:
        return refused
    lease = Lease(lambda: database(config))
    exp_id = machine.create(
        deps,
        change,
        actor=who,
        approved_by=who,
        reason="approved with --yes" if ns.yes else "confirmed in the terminal",
        owner=lease,
        plan=machine.ApprovedPlan.build(baseline, trial, server.gate, option.predicted_gain),
    )
    if option.verdict == "unsafe":
        audit.record(
            db,
            audit.Note(
                actor=who,
                created=deps.now(),
                server=ns.server,
                experiment_id=exp_id,
                text="run with --force despite: " + "; ".join(option.reasons),
            ),
        )
    return carry_and_report(deps, lease, db, exp_id, who, ns.json, out, err)


def carry_and_report(
    deps: machine.Deps,
    lease: Lease,
    db: Database,
    exp_id: int,
    who: str,
    as_json: bool,
    out: TextIO,
    err: TextIO,
) -> int:
    """Carry an approved experiment to its end here, say what it taught, and report it."""
    if not carry(deps, lease, err):
        return EXIT_FAILED
    for bound in after.learn(
        db, store.get_experiment(db, exp_id), deps.client.engine, actor=who, now=deps.now()
    ):
        err.write(f"  learnt: {bound.text()}; not proposed again without --force\n")
    return report(db, exp_id, as_json, out)


def cmd_server(
    ns: argparse.Namespace, config: Config, clock: Clock, out: TextIO, err: TextIO
) -> int:
    server = config.server(ns.server)
    launcher = wiring_launcher(config, server, clock)
    if ns.action == "status":
        state = launcher.state()
        args = launcher.current_args()
        if ns.json:
            data = {
                "server": ns.server,
                "running": state.running,
                "ready": state.ready,
                "pid": state.pid,
                "reason": state.reason,
                "args": args,
            }
            out.write(json.dumps(data) + "\n")
        else:
            out.write(status_text(ns.server, server.url, state, args))
        # 0 only when it serves: scripts wait on `kvpilot server status` like on a probe
        return EXIT_OK if state.running and state.ready else EXIT_FAILED
    if ns.action == "stop":
        launcher.stop()
        out.write(f"{ns.server} stopped\n")
        return EXIT_OK
    state = launcher.state()
    if state.running:
        out.write(
            f"{ns.server} is already running" + (f"; {state.reason}" if state.reason else "") + "\n"
        )
        return EXIT_OK
    launcher.start(launcher.current_args())
    launcher.wait_ready()
    out.write(f"{ns.server} is ready at {server.url}\n")
    return EXIT_OK


def status_text(name: str, url: str, state: Any, args: list[str]) -> str:
    if state.running and state.ready:
        # a note where there is one: a server this launcher did not start says whose it is
        head = f"{name}: ready at {url}" + (f"; {state.reason}" if state.reason else "")
    elif state.running:
        head = f"{name}: running but not ready at {url} ({state.reason or 'starting'})"
    else:
        why = state.reason or "not started by kvpilot"
        head = f"{name}: down ({why})"
    pid = f"pid {state.pid}" if state.pid is not None else "no pid"
    shown = " ".join(args) if args else "(none recorded)"
    return f"{head}\n  {pid}; arguments: {shown}\n"


# --------------------------------------------------------------------------- four-eyes
def _terminal_bot(config: Config, clock: Clock, err: TextIO) -> tuple[Any, Any]:
    """The chat core with the terminal as its surface, for proposals and approvals here."""
    from bot.chat.flow import Kvpilot  # noqa: PLC0415
    from bot.console.terminal import ConsoleSurface  # noqa: PLC0415 - only the four-eyes path needs it

    surface = ConsoleSurface(err, Path(config.state_dir) / "charts")
    flow = Kvpilot(
        config,
        lambda: database(config),
        clock=clock,
        group_members=lambda _group: frozenset(),
        surface_for=lambda _channel: surface,
    )
    return flow, surface


def _who_may_approve(config: Config, proposal_id: int, proposer: str) -> str:
    access = config.access
    approvers = ", ".join(access.approvers) if access and access.approvers else "none named"
    return (
        f"another person must approve it: an approver ([access] approvers: "
        f"{approvers}) with `/kvpilot approve {proposal_id}`, or another authorised OS user "
        f"(not {proposer.removeprefix('cli:')}) with `kvpilot experiments approve "
        f"{proposal_id}`"
    )


def propose_for_approval(
    ns: argparse.Namespace,
    config: Config,
    clock: Clock,
    change: dict[str, Any],
    who: str,
    err: TextIO,
) -> int:
    """Four-eyes: record the change as a proposal; its proposer may not approve it."""
    flow, surface = _terminal_bot(config, clock, err)
    try:
        principal = Principal(who, LOCAL_CHANNEL)
        proposal_id = flow.propose(principal, surface, ns.server, change, force=ns.force)
        if proposal_id is None:
            return EXIT_USAGE  # refused; the surface said why
        reason = "four-eyes is on: the person who proposed a change cannot approve it"
        flow.deny(principal, "approve", reason, server=ns.server, proposal_id=proposal_id)
    finally:
        flow.close()
    err.write(
        f"{reason}. Proposal {proposal_id} is recorded; nothing was changed. "
        f"{_who_may_approve(config, proposal_id, who).capitalize()}.\n"
    )
    return exit_codes.AWAITING_APPROVAL


def cmd_decide(
    ns: argparse.Namespace,
    config: Config,
    db: Database,
    clock: Clock,
    out: TextIO,
    err: TextIO,
    stdin: TextIO,
) -> int:
    """`kvpilot experiments approve|reject ID`: a person's decision on a recorded proposal."""
    try:
        proposal = proposal_store.get_proposal(db, ns.id)
    except NotFound:
        err.write(f"error: no proposal {ns.id}; proposals are listed by `/kvpilot status`\n")
        return EXIT_USAGE
    change = change_text(proposal.change)
    err.write(
        f"proposal {proposal.id} for {proposal.server}: {change} "
        f"(proposed by {proposal.created_by}, expires {proposal.expires_at:%Y-%m-%d %H:%M} UTC)\n"
    )
    if ns.action == "approve":
        refused = confirm(
            ns.yes,
            stdin,
            err,
            "Approve: restart the server with it, measure, keep only if better?",
            "not approved",
        )
        if refused is not None:
            return refused
    who = terminal_actor()
    earlier = proposal_store.approvals(db, proposal.id)
    flow, surface = _terminal_bot(config, clock, err)
    refusals: list[Refusal] = []
    try:
        exp_id = flow.decide(
            Principal(who, LOCAL_CHANNEL),
            surface,
            proposal.id,
            proposal.plan_hash[:16],
            ns.action,
            None,
            start=False,
            refused=refusals.append,
        )
    finally:
        flow.close()
    if refusals and refusals[0].reason is Reason.NOTHING_TO_CHANGE:
        return exit_codes.NOTHING_TO_CHANGE  # printed; the proposal is closed
    if earlier or not proposal_store.approvals(db, proposal.id):
        return EXIT_USAGE  # refused: the reason was printed (and audited)
    if ns.action == "reject":
        err.write(f"proposal {proposal.id} rejected; nothing was changed\n")
        return EXIT_OK
    if exp_id is None:
        return EXIT_FAILED  # approved, but the experiment could not be created (printed)
    lease = Lease(lambda: database(config), exp_id)
    if not lease.acquire():
        _say_carried_elsewhere(lease, err)
        return EXIT_FAILED
    deps = experiment_deps(config, proposal.server, db, _printer(err), clock=clock)
    return carry_and_report(deps, lease, db, exp_id, who, ns.json, out, err)


# --------------------------------------------------------------------------- abort
def cmd_abort(
    ns: argparse.Namespace, config: Config, db: Database, clock: Clock, out: TextIO, err: TextIO
) -> int:
    """`kvpilot experiments abort ID`: stop it; revert the server if anything changed."""
    try:
        row = store.get_experiment(db, ns.id)
    except NotFound:
        err.write(f"error: no experiment {ns.id}; `kvpilot experiments list` shows them\n")
        return EXIT_USAGE
    if row.terminal:
        err.write(f"experiment {row.id} already ended ({row.state}); nothing to abort\n")
        return EXIT_OK
    who = terminal_actor()
    deps = experiment_deps(config, row.server, db, _printer(err), clock=clock)
    moved = machine.abort(deps, row.id, actor=who, reason=f"aborted by {who} in the terminal")
    err.write(f"experiment {row.id} on {row.server}: {row.state} -> {moved.state}\n")
    lease = Lease(lambda: database(config), row.id)
    if not moved.terminal and not lease.acquire():
        deps.client.close()
        _say_carried_elsewhere(lease, err)
        err.write(
            "that process reverts the server at its next step (or, if someone changed its "
            "configuration outside kvpilot, leaves it as they set it); "
            f"`kvpilot experiments show {row.id}` follows it\n"
        )
        return exit_codes.CANCELLED
    if not moved.terminal and not carry(deps, lease, err):
        return EXIT_FAILED
    deps.client.close()
    return report(db, row.id, ns.json, out)
