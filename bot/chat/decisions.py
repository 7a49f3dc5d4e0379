"""Whether an approval or a rejection may go ahead: ordered checks over what is known.

`Kvpilot.decide` gathers the facts and acts on the outcome; the decision itself is here, pure,
so every refusal, its text and whether it is audited can be read, and tested, as one table.
The first check that matches refuses; the order is part of the behaviour:

1. Who asks (`bot.chat.auth`: roles, channels, four-eyes), before anything about the proposal
   is told to them.
2. The button's plan against the stored one: an old button for another plan is refused before
   the proposal's state is told.
3. Someone already decided.
4. For an approval: kvpilot is restarting (not audited, nobody did anything wrong); then the
   proposal expired (the caller also closes it).

Only an approval that passes those reads the server, since reading its launch arguments asks
the launcher (Docker, Kubernetes) and is not worth doing for a request refused anyway:

5. Its configuration cannot be read.
6. It already runs the change, so nothing would change (someone set it by hand since the
   proposal, or the proposal was recorded before such changes were refused); the caller also
   closes the proposal. Before 7, which would otherwise say only that the configuration changed.
7. Its configuration changed since the proposal (the plan would restart it from other args).
8. An experiment is already running on it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Generic, Literal, TypeVar

from bot.chat.auth import Decision
from bot.chat.render import mention
from bot.chat.when import hhmm

Verb = Literal["approve", "reject"]


class Reason(Enum):
    """Why a decision is refused; the caller acts on some of them (an expired proposal)."""

    NOT_AUTHORISED = "not authorised"
    OTHER_PLAN = "other plan"
    ALREADY_DECIDED = "already decided"
    RESTARTING = "restarting"
    EXPIRED = "expired"
    CONFIG_UNREADABLE = "configuration unreadable"
    NOTHING_TO_CHANGE = "nothing to change"
    CONFIG_CHANGED = "configuration changed"
    SERVER_BUSY = "server busy"
    CLAIM_LOST = "claim lost"  # another bot of the estate claims the server now


@dataclass(frozen=True)
class GoAhead:
    """Nothing stands in the way of the decision."""


GO_AHEAD = GoAhead()


@dataclass(frozen=True)
class Refusal:
    """The decision is refused: `text` tells the person, and the audit log when `audited`."""

    reason: Reason
    text: str
    audited: bool = True


Outcome = GoAhead | Refusal


@dataclass(frozen=True)
class Earlier:
    """The first decision already stored on the proposal."""

    decision: str
    actor: str


@dataclass(frozen=True)
class ProposalFacts:
    """What is known about the request and the proposal without asking the server.

    `authorisation` is `bot.chat.auth`'s answer for the asker against the proposer, taken as
    a fact: resolving user groups asks Slack, and who may do what is decided there only.
    """

    verb: Verb
    proposal_id: int
    authorisation: Decision
    button_hash: str
    stored_hash: str
    earlier: Earlier | None
    restarting: bool
    now: datetime
    expires_at: datetime


@dataclass(frozen=True)
class ServerFacts:
    """What the server's launcher says now, against what the proposal was made from.

    `current_args` is None when the configuration could not be read (`config_error` says why);
    `unchanged` says why the change would change nothing on what runs now
    (`playbooks.experiments.no_change`), None when it changes something.
    """

    server: str
    proposed_args: tuple[object, ...] | None
    current_args: tuple[str, ...] | None
    config_error: str | None
    running_experiment: int | None
    unchanged: str | None = None


Facts = TypeVar("Facts", ProposalFacts, ServerFacts)


@dataclass(frozen=True)
class Check(Generic[Facts]):
    """One row of a table: when `refuses` holds, the decision is refused with `says`."""

    reason: Reason
    refuses: Callable[[Facts], bool]
    says: Callable[[Facts], str]
    audited: bool = True


PROPOSAL_CHECKS: tuple[Check[ProposalFacts], ...] = (
    Check(
        Reason.NOT_AUTHORISED,
        lambda f: not f.authorisation.allowed,
        lambda f: f.authorisation.reason,
    ),
    Check(
        Reason.OTHER_PLAN,
        lambda f: not f.stored_hash.startswith(f.button_hash),
        lambda f: "this button is for a different plan than the one stored; propose again",
    ),
    Check(
        Reason.ALREADY_DECIDED,
        lambda f: f.earlier is not None,
        lambda f: _already_decided(f.proposal_id, f.earlier),
    ),
    Check(
        Reason.RESTARTING,
        lambda f: f.verb == "approve" and f.restarting,
        lambda f: "kvpilot is restarting; approve again once it is back",
        audited=False,
    ),
    Check(
        Reason.EXPIRED,
        lambda f: f.verb == "approve" and f.now >= f.expires_at,
        lambda f: f"the proposal expired at {hhmm(f.expires_at)}; propose it again",
    ),
)

SERVER_CHECKS: tuple[Check[ServerFacts], ...] = (
    Check(
        Reason.CONFIG_UNREADABLE,
        lambda f: f.config_error is not None,
        lambda f: f"cannot read the server's configuration: {f.config_error}",
    ),
    Check(
        Reason.NOTHING_TO_CHANGE,
        lambda f: f.unchanged is not None,
        lambda f: f"{f.unchanged}; nothing was changed",
    ),
    Check(
        Reason.CONFIG_CHANGED,
        lambda f: f.current_args != f.proposed_args,
        lambda f: (
            "the server's configuration changed since this was proposed (now: "
            f"`{' '.join(f.current_args or ())}`); propose again against the current "
            "configuration"
        ),
    ),
    Check(
        Reason.SERVER_BUSY,
        lambda f: f.running_experiment is not None,
        lambda f: f"experiment {f.running_experiment} is already running on `{f.server}`",
    ),
)


def _already_decided(proposal_id: int, earlier: Earlier | None) -> str:
    assert earlier is not None  # the check only says this when there is an earlier decision
    return f"proposal {proposal_id} was already {earlier.decision} by {mention(earlier.actor)}"


def first_refusal(checks: tuple[Check[Facts], ...], facts: Facts) -> Outcome:
    """The first row of `checks` that refuses, as a `Refusal`; `GO_AHEAD` when none does."""
    for check in checks:
        if check.refuses(facts):
            return Refusal(check.reason, check.says(facts), check.audited)
    return GO_AHEAD


def judge_proposal(facts: ProposalFacts) -> Outcome:
    """Checks 1-4: who asks, for which plan, and the proposal's state."""
    return first_refusal(PROPOSAL_CHECKS, facts)


def judge_server(facts: ServerFacts) -> Outcome:
    """Checks 5-8, for an approval that passed `judge_proposal`: the server's state."""
    return first_refusal(SERVER_CHECKS, facts)


def args_of(value: object) -> tuple[object, ...] | None:
    """Launch arguments as stored in a proposal's snapshot (a JSON list), or None if absent."""
    return tuple(value) if isinstance(value, list) else None
