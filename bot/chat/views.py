"""Messages read off storage and configuration: a proposal's approval message, status, history.

Messages the conversation shows that are read off storage and configuration: the approval
message of a proposal, status and history.

They are built here, apart from `bot.chat.flow`, because they only read: the flow decides and
acts, these say how things stand.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from sqlite_utils import Database

from bot.app.config import Config
from bot.app.wiring import engine_client
from bot.chat.messages import Button, Confirm, Message
from bot.chat.render import change_text
from bot.chat.when import hhmm
from playbooks.engines.base import EngineError
from playbooks.experiments.plans import plan_from_json
from playbooks.gate.result import GateResult
from storage import audit, chat
from storage import experiments as store
from storage import proposals as proposal_store

# The buttons' action ids, the same in every front end.
PROPOSE_OPTION = "kvpilot.propose"
APPROVE = "kvpilot.approve"
REJECT = "kvpilot.reject"
ROLLOUT = "kvpilot.rollout"  # a kept group experiment's verdict: roll it out (bot.chat.rollout)
DIAGNOSE = "kvpilot.diagnose"  # an alert's button: diagnose the server it names
ACTIONS = (PROPOSE_OPTION, APPROVE, REJECT, ROLLOUT, DIAGNOSE)


class DescribesExperiments(Protocol):
    def describe(self, row: store.ExperimentRow) -> dict[str, Any]: ...


def approval_message(
    row: proposal_store.ProposalRow,
    option: dict[str, Any],
    *,
    restartable: bool = True,
    restart_s: float | None = None,
    drain: str | None = None,
) -> Message:
    """The proposal with its diff, prediction, risks and gate, and Approve/Reject buttons;
    `drain`: how a router in front of the server spares its running requests (`routing`).

    A plan whose arguments after are those before (recorded before such proposals were
    refused) gets no Approve button: its approval would only be refused."""
    value = f"{row.id}:{row.plan_hash[:16]}"
    server = row.server
    plan = plan_from_json(row.plan)
    diff = arg_diff(list(plan.from_args), list(plan.to_args))
    buttons: tuple[Button, ...] = (
        Button(
            APPROVE,
            value,
            "Approve",
            "primary",
            Confirm(
                "Restart and measure?",
                f"`{server}` restarts with the new arguments, its running requests are "
                + ("drained through its router" if drain else "dropped")
                + ", and the change is kept only if throughput improves.",
                "Approve",
            ),
        ),
        reject_button(value, "change"),
    )
    if diff == NO_CHANGE:
        buttons = buttons[1:]
    return Message.from_template(
        "chat/proposal.md.j2",
        buttons=buttons if restartable else (),
        p=row,
        o=option,
        diff=diff,
        gate=dict(plan.gate),
        snap=row.snapshot,
        expires=hhmm(row.expires_at),
        restart_s=restart_s,
        drain=drain,
    )


def last_restart_s(db: Database, server: str) -> float | None:
    """How long the server's last restart took, from the audit log (None if never)."""
    for ev in reversed(audit.events(db, server=server, name="restart_finished")):
        seconds = ev["properties"].get("duration_s")
        if isinstance(seconds, (int, float)):
            return float(seconds)
    return None


# Servers `status` asks for their health one by one. A fleet's status takes each server's health
# from the sampler's last round instead (the schedule lines): 500 live checks a command would
# take minutes and flood the servers, and 500 lines are no message.
LIVE_STATUS_MAX = 20


def _live_health(config: Config, name: str) -> dict[str, Any]:
    cfg = config.server(name)
    client = engine_client(cfg, timeout_s=2.0)
    try:
        health = "healthy" if client.health() else "not healthy"
    except EngineError as exc:
        health = f"unreachable ({exc})"
    finally:
        client.close()
    return {"name": name, "url": cfg.url, "health": health}


def status_message(
    db: Database,
    config: Config,
    runner: DescribesExperiments,
    server: str | None,
    *,
    schedule: list[str],
    frozen: Sequence[str] = (),
) -> Message:
    """Each server's health, the running experiments, pending proposals, the freezes in
    force, the schedules."""
    active = [e for e in store.active_experiments(db) if server in (None, e.server)]
    names = [server] if server else sorted(config.servers)
    live = len(names) <= LIVE_STATUS_MAX
    return Message.from_template(
        "chat/status.md.j2",
        servers=[_live_health(config, name) for name in names] if live else [],
        fleet=None if live else len(names),
        active=[runner.describe(e) for e in active],
        pending=len(chat.pending_proposals(db)),
        schedule=schedule,
        frozen=list(frozen),
    )


def history_message(db: Database, server: str | None) -> Message:
    """The last 15 experiments, newest first."""
    rows = store.list_experiments(db, server=server)[:15]
    items = []
    for r in rows:
        effect = None if r.result is None else GateResult.from_json(r.result).effect
        items.append(
            {
                "id": r.id,
                "server": r.server,
                "state": str(r.state),
                "change": change_text(r.change),
                "when": hhmm(r.created_at),
                "effect": None if effect is None else effect.mean,
            }
        )
    return Message.from_template("chat/history.md.j2", items=items, server=server)


NO_CHANGE = "(no change: the server already runs these arguments)"


def arg_diff(before: list[str], after: list[str]) -> str:
    """A unified-diff-like view of the launch arguments, one `--flag value` per line."""

    def pairs(args: list[str]) -> list[str]:
        out: list[str] = []
        for tok in args:
            if tok.startswith("--") or not out:
                out.append(tok)
            else:
                out[-1] += " " + tok
        return out

    old, new = pairs(before), pairs(after)
    lines = [f"- {p}" for p in old if p not in new] + [f"+ {p}" for p in new if p not in old]
    return "\n".join(lines) or NO_CHANGE


def reject_button(value: str, what: str) -> Button:
    """The Reject button of an approval message, confirmed before it is taken."""
    return Button(
        REJECT,
        value,
        "Reject",
        "danger",
        Confirm(f"Reject this {what}?", "Nothing will be changed on the server.", "Reject"),
    )
