"""`kvpilot experiment`, `kvpilot experiments list|show` and `kvpilot resume`."""

from __future__ import annotations

import argparse
import getpass
import json
from collections.abc import Callable
from typing import Any, TextIO

from sqlite_utils import Database

from bot.config import Config, ConfigError, load
from bot.wiring import database, diagnose_settings, experiment_deps
from bot.wiring import launcher as wiring_launcher
from playbooks import experiment as engine
from playbooks.clock import make_clock
from playbooks.diagnose import judge_change
from playbooks.launchers.base import LaunchError, with_change
from playbooks.server_args import ArgError, parse_change
from playbooks.sources.sglang import SGLangError
from storage import audit
from storage import experiments as store
from storage.errors import NotFound, StorageError
from storage.experiments import State

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli:operator"


def _printer(err: TextIO) -> Callable[[str], None]:
    def say(message: str) -> None:
        err.write(f"  {message}\n")
        err.flush()

    return say


def dispatch(ns: argparse.Namespace, out: TextIO, err: TextIO, stdin: TextIO) -> int:
    try:
        config = load(ns.config)
        db = database(config)
    except (ConfigError, StorageError) as exc:
        err.write(f"error: {exc}\n")
        return EXIT_USAGE
    try:
        if ns.command == "experiment":
            return cmd_experiment(ns, config, db, out, err, stdin)
        if ns.command == "server":
            return cmd_server(ns, config, out, err)
        if ns.command == "resume":
            count = resume_unfinished(config, db, err)
            out.write(f"{count} unfinished experiment(s) handled\n")
            return EXIT_OK
        if ns.action == "list":
            return cmd_list(ns, db, out)
        if ns.action == "show":
            return cmd_show(ns, db, out, err)
        err.write("error: use `kvpilot experiments list` or `kvpilot experiments show ID`\n")
        return EXIT_USAGE
    except (ConfigError, ArgError) as exc:
        err.write(f"error: {exc}\n")
        return EXIT_USAGE
    except (SGLangError, LaunchError) as exc:
        err.write(f"error: {exc}\n")
        return EXIT_FAILED


def resume_unfinished(config: Config, db: Database, err: TextIO, server: str | None = None) -> int:
    """Every experiment a crash left active is resumed where safe, reverted otherwise."""
    count = 0
    for row in store.active_experiments(db):
        if server is not None and row.server != server:
            continue
        if row.state == State.proposed:
            continue  # waiting for a person's approval; nothing runs
        deps = experiment_deps(config, row.server, db, _printer(err))
        err.write(f"resuming experiment {row.id} on {row.server} (was {row.state})\n")
        engine.resume_policy(deps, row.id, actor="kvpilot")
        engine.run(deps, row.id)
        count += 1
    return count


def cmd_experiment(
    ns: argparse.Namespace, config: Config, db: Database, out: TextIO, err: TextIO, stdin: TextIO
) -> int:
    server = config.server(ns.server)
    items = [item for group in ns.set for item in group]
    if not items:
        raise ArgError("nothing to change: give --set KEY=VALUE (e.g. mem_fraction_static=0.88)")
    change = parse_change(items)
    resume_unfinished(config, db, err, server=ns.server)
    deps = experiment_deps(config, ns.server, db, _printer(err))
    info = deps.client.server_info()
    option = judge_change(info, change, diagnose_settings(server))
    baseline = deps.launcher.current_args()
    trial = with_change(baseline, change)
    err.write(f"server {ns.server} ({server.url}): change {option.title}\n")
    err.write(f"  from: {' '.join(baseline)}\n  to:   {' '.join(trial)}\n")
    if option.predicted_max_total_num_tokens is not None:
        err.write(
            f"  KV capacity {info.max_total_num_tokens:,} -> "
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
    if not ns.yes:
        if not stdin.isatty():
            err.write("error: confirmation needed and there is no terminal: re-run with --yes\n")
            return EXIT_USAGE
        err.write("Apply this change, measure it, and keep it only if throughput improves? [y/N] ")
        err.flush()
        if stdin.readline().strip().lower() not in ("y", "yes"):
            err.write("not applied\n")
            return EXIT_OK
    who = actor()
    exp_id = engine.create(
        deps,
        change,
        actor=who,
        approved_by=who,
        reason="approved with --yes" if ns.yes else "confirmed in the terminal",
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
    row = engine.run(deps, exp_id)
    summary = summarise(db, row)
    if ns.json:
        out.write(json.dumps(summary) + "\n")
    else:
        out.write(render_summary(summary))
    return EXIT_FAILED if row.state == State.failed else EXIT_OK


def summarise(db: Database, row: store.ExperimentRow) -> dict[str, Any]:
    result = row.result or {}
    moves = store.transitions(db, row.id)
    return {
        "id": row.id,
        "server": row.server,
        "state": str(row.state),
        "change": row.change,
        "verdict": result.get("verdict"),
        "baseline": result.get("baseline"),
        "trial": result.get("trial"),
        "effect": result.get("effect"),
        "rule": result.get("rule"),
        "reason": moves[-1].reason if moves else "",
        "transitions": [
            {
                "from": None if m.from_state is None else str(m.from_state),
                "to": str(m.to_state),
                "reason": m.reason,
                "actor": m.actor,
                "at": m.created_at.isoformat(timespec="seconds"),
            }
            for m in moves
        ],
        "took_s": round((moves[-1].created_at - moves[0].created_at).total_seconds(), 1)
        if moves
        else None,
        "trial_s": result.get("trial_s"),
        "baseline_config": row.baseline_config,
        "trial_config": row.trial_config,
    }


def _interval(x: dict[str, Any] | None, pct: bool = False) -> str:
    if not x:
        return "n/a"
    mean = x["mean"] * 100 if pct else x["mean"]
    unit = "%" if pct else " tok/s"
    text = f"{mean:+.1f}{unit}" if pct else f"{mean:,.1f}{unit}"
    if x.get("ci95"):
        low, high = x["ci95"]
        if pct:
            text += f" (95% {low * 100:+.1f}..{high * 100:+.1f}%)"
        else:
            text += f" (95% {low:,.1f}..{high:,.1f})"
    return text


def render_summary(s: dict[str, Any]) -> str:
    lines = [
        f"experiment {s['id']} on {s['server']}: {s['state'].upper()}",
        f"  change    {s['change']}",
        f"  baseline  {_interval(s['baseline'])}",
        f"  trial     {_interval(s['trial'])}",
        f"  effect    {_interval(s['effect'], pct=True)}",
        f"  why       {s['reason']}",
        f"  took      {s['took_s']} s (trial {s['trial_s']} s)",
    ]
    return "\n".join(lines) + "\n"


def cmd_list(ns: argparse.Namespace, db: Database, out: TextIO) -> int:
    rows = store.list_experiments(db, server=ns.server)
    if ns.json:
        out.write(json.dumps([summarise(db, r) for r in rows]) + "\n")
        return EXIT_OK
    out.write(f"{'id':>4}  {'server':12} {'state':11} {'created':20} change\n")
    for r in rows:
        created = r.created_at.isoformat(timespec="seconds")[:19]
        out.write(f"{r.id:>4}  {r.server:12} {r.state!s:11} {created:20} {r.change}\n")
    return EXIT_OK


def cmd_show(ns: argparse.Namespace, db: Database, out: TextIO, err: TextIO) -> int:
    try:
        row = store.get_experiment(db, ns.id)
    except NotFound:
        err.write(f"error: no experiment {ns.id}; `kvpilot experiments list` shows them\n")
        return EXIT_USAGE
    summary = summarise(db, row)
    summary["audit"] = audit.events(db, experiment_id=row.id)
    if ns.json:
        out.write(json.dumps(summary, default=str) + "\n")
        return EXIT_OK
    out.write(render_summary(summary))
    out.write("  transitions:\n")
    for t in summary["transitions"]:
        out.write(f"    {t['at'][:19]}  {t['from'] or '-':11} -> {t['to']:11} {t['reason']}\n")
    out.write("  audit:\n")
    for ev in summary["audit"]:
        out.write(f"    {str(ev.get('created_at'))[:19]}  {ev.get('name')} by {ev.get('actor')}\n")
    return EXIT_OK


def cmd_server(ns: argparse.Namespace, config: Config, out: TextIO, err: TextIO) -> int:
    server = config.server(ns.server)
    launcher = wiring_launcher(config, server, make_clock(config.time_scale))
    if ns.action == "status":
        state = launcher.state()
        out.write(
            json.dumps(
                {
                    "server": ns.server,
                    "running": state.running,
                    "ready": state.ready,
                    "pid": state.pid,
                    "reason": state.reason,
                    "args": launcher.current_args(),
                }
            )
            + "\n"
        )
        return EXIT_OK
    if ns.action == "stop":
        launcher.stop()
        out.write(f"{ns.server} stopped\n")
        return EXIT_OK
    if launcher.state().running:
        out.write(f"{ns.server} is already running\n")
        return EXIT_OK
    launcher.start(launcher.current_args())
    launcher.wait_ready()
    out.write(f"{ns.server} is ready at {server.url}\n")
    return EXIT_OK
