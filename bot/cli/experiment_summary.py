"""`kvpilot experiments list|show` and the summary printed when an experiment ends.

What the terminal shows of an experiment: its outcome and cause first (`outcome.ending`), the
gate's estimates with their intervals, the transitions and the audit trail. The JSON forms carry
the same fields, for scripts.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import Any, TextIO

from sqlite_utils import Database

from bot.chat.render import change_text, utc_text
from bot.cli import exit_codes
from playbooks.experiments.outcome import DESCRIPTIONS, ending
from storage import audit
from storage import experiments as store
from storage.errors import NotFound


def report(db: Database, exp_id: int, as_json: bool, out: TextIO) -> int:
    """Print the finished experiment; its exit code says how it ended."""
    summary = summarise(db, store.get_experiment(db, exp_id))
    out.write(json.dumps(summary) + "\n" if as_json else render_summary(summary))
    return int(summary["exit_code"])


def summarise(db: Database, row: store.ExperimentRow) -> dict[str, Any]:
    result = row.result or {}
    moves = store.transitions(db, row.id)
    end = ending(row, moves)
    return {
        "id": row.id,
        "server": row.server,
        "state": str(row.state),
        "outcome": str(end.outcome),
        "cause": end.cause,
        "exit_code": exit_codes.BY_OUTCOME[end.outcome],
        "change": row.change,
        "verdict": result.get("verdict"),
        "baseline": result.get("baseline"),
        # measured, or which stored window (the sampler's, a diagnosis's) it was taken from
        "baseline_source": result.get("baseline_source"),
        "trial": result.get("trial"),
        "effect": result.get("effect"),
        "rule": result.get("rule"),
        # why it ended first (the cause); what followed (the revert) is in `then`
        "reason": end.cause,
        "then": end.then,
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
        "unread_s": result.get("unread_s") or 0.0,
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


def stored_time(value: object) -> str:
    """A stored time (a datetime, or SQLite's ISO text) with its zone."""
    if isinstance(value, str):
        try:
            return utc_text(datetime.fromisoformat(value))
        except ValueError:
            return value
    return utc_text(value) if isinstance(value, datetime) else str(value)


def render_summary(s: dict[str, Any]) -> str:
    lines = [
        f"experiment {s['id']} on {s['server']}: {s['state'].upper()} "
        f"({DESCRIPTIONS[s['outcome']]}; exit {s['exit_code']})",
        f"  why       {s['reason']}",
    ]
    if s.get("then"):
        lines.append(f"  then      {s['then']}")
    lines += [
        f"  change    {change_text(s['change'])}",
        f"  baseline  {_interval(s['baseline'])}"
        + (f", {s['baseline_source']}" if s.get("baseline_source") else ""),
        f"  trial     {_interval(s['trial'])}",
        f"  effect    {_interval(s['effect'], pct=True)}",
        f"  took      {s['took_s']} s" + _trial(s),
    ]
    return "\n".join(lines) + "\n"


def _trial(s: dict[str, Any]) -> str:
    """How long the trial measured, where one ran (one cancelled before its restart had none)."""
    if s.get("trial_s") is None:
        return " (no trial)"
    return f" (trial {s['trial_s']} s{_unread(s)})"


def _unread(s: dict[str, Any]) -> str:
    """The part of the trial nobody read (kvpilot down), which the verdict did not count."""
    unread = float(s.get("unread_s") or 0.0)
    return f", {unread:.0f} s of it unread and not counted" if unread > 0 else ""


def audit_line(event: dict[str, Any]) -> str:
    """One audit event as `experiments show` lists it: what it was, by whom, and for the
    events that tell an experiment's interruptions, what happened."""
    props = event.get("properties") or {}
    line = f"{event.get('name')} by {event.get('actor')}"
    if event.get("name") == "experiment_resumed":
        previous = props.get("previous") or "nobody"
        read = props.get("last_read_at")
        line += f": taken from {previous}, {props.get('how')}" + (
            f"; last read {stored_time(read)}" if read else ""
        )
    elif event.get("name") == "measurement_gap":
        kept = "bridged (not counted)" if props.get("bridged") else "cut the measurement"
        line += (
            f": {props.get('phase')} unread for {props.get('seconds')} s after "
            f"{stored_time(props.get('since'))}, {kept}: {props.get('cause')}"
        )
    return line


def cmd_list(ns: argparse.Namespace, db: Database, out: TextIO) -> int:
    rows = store.list_experiments(db, server=ns.server)
    if ns.json:
        out.write(json.dumps([summarise(db, r) for r in rows]) + "\n")
        return exit_codes.OK
    out.write(f"{'id':>4}  {'server':12} {'state':11} {'created':23} change\n")
    for r in rows:
        created = utc_text(r.created_at)
        out.write(f"{r.id:>4}  {r.server:12} {r.state!s:11} {created:23} {change_text(r.change)}\n")
    return exit_codes.OK


def cmd_show(ns: argparse.Namespace, db: Database, out: TextIO, err: TextIO) -> int:
    try:
        row = store.get_experiment(db, ns.id)
    except NotFound:
        err.write(f"error: no experiment {ns.id}; `kvpilot experiments list` shows them\n")
        return exit_codes.USAGE
    summary = summarise(db, row)
    summary["audit"] = audit.events(db, experiment_id=row.id)
    if ns.json:
        out.write(json.dumps(summary, default=str) + "\n")
        return exit_codes.OK
    out.write(render_summary(summary))
    out.write("  transitions:\n")
    for t in summary["transitions"]:
        at = utc_text(datetime.fromisoformat(t["at"]))
        out.write(f"    {at}  {t['from'] or '-':11} -> {t['to']:11} {t['reason']}\n")
    out.write("  audit:\n")
    for ev in summary["audit"]:
        at = stored_time(ev.get("created_at"))
        out.write(f"    {at}  {audit_line(ev)}\n")
    return exit_codes.OK
