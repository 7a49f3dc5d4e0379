"""Who may do what, and where: the one place kvpilot decides it.

Every command and button goes through `authorise` before anything runs, in Slack and in the
terminal front end alike. Identities are Slack user IDs taken from the signed request (never
names, never text from a message or a button); the terminal's identity is the local account
(`console:NAME` in the console, `cli:NAME` on the command line, NAME from the process's uid,
never from the environment), which already owns the database and could run any kvpilot
command, so it gets every role, but four-eyes still holds for it: one account is one person,
whichever terminal front end it uses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from bot.app.config import SlackConfig

Action = Literal[
    "help", "status", "history", "diagnose", "report", "propose", "approve", "reject", "abort"
]
READ_ONLY: frozenset[str] = frozenset({"help", "status", "history"})
OPERATOR: frozenset[str] = frozenset({"diagnose", "report", "propose", "abort"})
ACTIONS: frozenset[str] = READ_ONLY | OPERATOR | {"approve", "reject"}
CONSOLE_PREFIX = "console:"
CLI_PREFIX = "cli:"
LOCAL_PREFIXES = (CONSOLE_PREFIX, CLI_PREFIX)


@dataclass(frozen=True)
class Principal:
    """Who is asking, from where. `user` is a Slack user ID or `console:NAME`."""

    user: str
    channel: str | None = None

    @property
    def local(self) -> bool:
        return self.user.startswith(LOCAL_PREFIXES)


def person(user: str) -> str:
    """The person behind an actor: `console:alice` and `cli:alice` are the same account."""
    for prefix in LOCAL_PREFIXES:
        if user.startswith(prefix):
            return "local:" + user.removeprefix(prefix)
    return user


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""


ALLOW = Decision(True)
GroupMembers = Callable[[str], frozenset[str]]


def _members(ids: tuple[str, ...], group_members: GroupMembers) -> frozenset[str]:
    users: set[str] = set()
    for entry in ids:
        if entry.startswith("S"):
            users |= group_members(entry)
        else:
            users.add(entry)
    return frozenset(users)


def authorise(
    policy: SlackConfig | None,
    who: Principal,
    action: Action,
    *,
    group_members: GroupMembers,
    proposer: str | None = None,
) -> Decision:
    """Whether `who` may do `action` in their channel; the reason says why not, for them.

    `proposer` is the person who proposed the change being approved or rejected (four-eyes:
    the proposer cannot approve their own change, but may withdraw it by rejecting).
    """
    if action not in ACTIONS:
        return Decision(False, f"unknown action {action!r}")
    four_eyes = policy is not None and policy.four_eyes
    if (
        action == "approve"
        and four_eyes
        and proposer is not None
        and person(proposer) == person(who.user)
    ):
        return Decision(
            False,
            "four-eyes is on: the person who proposed a change cannot approve it; "
            "ask another approver",
        )
    if who.local:
        return ALLOW
    if policy is None:
        return Decision(
            False,
            "this bot has no [slack] section in kvpilot.toml, so nobody may use it from Slack",
        )
    if action == "help":
        return ALLOW
    if policy.channels and who.channel not in policy.channels:
        allowed = ", ".join(f"<#{c}>" for c in policy.channels)
        return Decision(False, f"kvpilot only works in {allowed}")
    if action in READ_ONLY:
        return ALLOW
    approvers = _members(policy.approvers, group_members)
    if action == "reject" and proposer is not None and person(proposer) == person(who.user):
        return ALLOW  # withdrawing one's own proposal
    if action in ("approve", "reject"):
        if who.user in approvers:
            return ALLOW
        return Decision(False, "only the approvers named in kvpilot.toml ([slack] approvers) may")
    operators = _members(policy.operators, group_members)
    if who.user in operators or who.user in approvers:
        return ALLOW
    return Decision(
        False,
        f"only operators and approvers may {action} ([slack] operators / approvers in "
        "kvpilot.toml)",
    )
