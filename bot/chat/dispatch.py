"""What each `/kvpilot` command does: one handler a command, looked up by its name.

A handler answers at once (a `Reply`, shown privately) and leaves the slow part as work for
afterwards, so a Slack front end acknowledges within 3 s. `Kvpilot.command` parses and
authorises before a handler runs, except for the verbs in `DECIDED_AGAINST_PROPOSER`, which
`Kvpilot.decide` authorises against the proposal's proposer (four-eyes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bot.chat import campaign, freezes
from bot.chat.auth import Principal
from bot.chat.commands import USAGE, Command
from bot.chat.conversation import Conversation, Work
from bot.chat.messages import Message
from playbooks.campaigns.policy import Allowance


@dataclass(frozen=True)
class Reply:
    """What to tell the person at once (privately), and the work that follows, if any."""

    now: Message | None
    work: Work | None = None


Handler = Callable[[Conversation, Principal, Command], Reply]
DECIDED_AGAINST_PROPOSER = frozenset({"approve", "reject"})


def _help(bot: Conversation, who: Principal, cmd: Command) -> Reply:
    return Reply(Message.from_template("chat/help.md.j2", usage=USAGE))


def _diagnose(bot: Conversation, who: Principal, cmd: Command) -> Reply:
    assert cmd.server is not None  # parse_command requires one for diagnose
    return Reply(
        Message.note(f"Diagnosing `{cmd.server}`; the analysis will appear here."),
        lambda s: bot.run_diagnose(cmd.server or "", who, s),
    )


def _propose(bot: Conversation, who: Principal, cmd: Command) -> Reply:
    return Reply(None, lambda s: bot.propose(who, s, cmd.server or "", cmd.change, force=cmd.force))


def _status(bot: Conversation, who: Principal, cmd: Command) -> Reply:
    return Reply(None, lambda s: s.post(bot.status_message(cmd.server)))


def _history(bot: Conversation, who: Principal, cmd: Command) -> Reply:
    return Reply(None, lambda s: s.post(bot.history_message(cmd.server)))


def _abort(bot: Conversation, who: Principal, cmd: Command) -> Reply:
    return Reply(None, lambda s: bot.abort(who, s, cmd.experiment_id or 0))


def _decide(bot: Conversation, who: Principal, cmd: Command) -> Reply:
    return Reply(None, lambda s: bot.decide_by_id(who, s, cmd.proposal_id or 0, cmd.name))


def _report(bot: Conversation, who: Principal, cmd: Command) -> Reply:
    hook = bot.report_hook
    if hook is None:
        return Reply(Message.note("Reports are not available in this build."))
    what = f"`{cmd.server}`" if cmd.group is None else f"{len(cmd.members)} servers"
    return Reply(
        Message.note(f"Building the report for {what}..."),
        lambda s: hook(cmd, who, s),
    )


def _tune(bot: Conversation, who: Principal, cmd: Command) -> Reply:
    plan = Allowance.from_json(cmd.plan or {})
    return Reply(None, lambda s: campaign.propose_plan(bot, who, s, cmd.server or "", plan))


def _freeze(bot: Conversation, who: Principal, cmd: Command) -> Reply:
    spec = cmd.freeze
    assert spec is not None  # parse_command sets it for both verbs
    act = freezes.freeze if cmd.name == "freeze" else freezes.unfreeze
    return Reply(None, lambda s: act(bot, who, s, spec))


HANDLERS: dict[str, Handler] = {
    "help": _help,
    "diagnose": _diagnose,
    "propose": _propose,
    "status": _status,
    "history": _history,
    "abort": _abort,
    "approve": _decide,
    "reject": _decide,
    "report": _report,
    "tune": _tune,
    "freeze": _freeze,
    "unfreeze": _freeze,
}
