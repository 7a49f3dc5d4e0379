"""Who may do what, and where: the one place kvpilot decides it.

Every command and button goes through `authorise` before anything runs, in Slack, the console
and on the command line, all by the one `[access]` policy (`AccessPolicy`). Identities are the
chat service's user IDs taken from the signed request (never names, never text from a message
or a button); the terminal's identity is the local account (`console:NAME` in the console,
`cli:NAME` on the command line, NAME from the process's uid, never from the environment),
listed in `[access]` as `local:NAME`: one account is one person, whichever terminal front end
it uses.

When `[access]` names no local account, the terminal's accounts get every role: they already
own the database and could run any kvpilot command. Once it names one, they get exactly the
roles listed (an unlisted account may only read). Four-eyes holds for everyone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from bot.app.config import LOCAL_PREFIX, AccessPolicy
from bot.chat.identity import OPAQUE, Identity

Action = Literal[
    "help",
    "status",
    "history",
    "diagnose",
    "report",
    "propose",
    "approve",
    "reject",
    "abort",
    "restart",
    "freeze",
    "unfreeze",
]
READ_ONLY: frozenset[str] = frozenset({"help", "status", "history"})
OPERATOR: frozenset[str] = frozenset(
    {"diagnose", "report", "propose", "abort", "restart", "freeze"}
)
# deciding: approvers only (lifting a freeze lets changes start again, as an approval does)
DECIDING: frozenset[str] = frozenset({"approve", "reject", "unfreeze"})
ACTIONS: frozenset[str] = READ_ONLY | OPERATOR | DECIDING
CONSOLE_PREFIX = "console:"
CLI_PREFIX = "cli:"
LOCAL_PREFIXES = (CONSOLE_PREFIX, CLI_PREFIX)


@dataclass(frozen=True)
class Principal:
    """Who is asking, from where. `user` is a chat user ID, `console:NAME` or `cli:NAME`."""

    user: str
    channel: str | None = None
    button: bool = False  # a click on one of kvpilot's buttons (not typed text)

    @property
    def local(self) -> bool:
        return self.user.startswith(LOCAL_PREFIXES)


def person(user: str) -> str:
    """The person behind an actor: `console:alice` and `cli:alice` are the same account."""
    for prefix in LOCAL_PREFIXES:
        if user.startswith(prefix):
            return LOCAL_PREFIX + user.removeprefix(prefix)
    return user


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""


ALLOW = Decision(True)
GroupMembers = Callable[[str], frozenset[str]]
FOUR_EYES = (
    "four-eyes is on: the person who proposed a change cannot approve it; ask another approver"
)


def _members(entries: tuple[str, ...], group_members: GroupMembers) -> frozenset[str]:
    """The people `entries` name: each entry, and the members of those that are groups (the
    front end's `group_members` knows which are: it answers nobody for a person's ID)."""
    users: set[str] = set(entries)
    for entry in entries:
        users |= group_members(entry)
    return frozenset(users)


def _no_group(_group: str) -> frozenset[str]:
    return frozenset()  # a chat's user groups never hold a local account


def _own(proposer: str | None, who: Principal) -> bool:
    return proposer is not None and person(proposer) == person(who.user)


def authorise(
    policy: AccessPolicy | None,
    who: Principal,
    action: Action,
    *,
    group_members: GroupMembers,
    proposer: str | None = None,
    channels: tuple[str, ...] = (),
    ids: Identity = OPAQUE,
) -> Decision:
    """Whether `who` may do `action` in their channel; the reason says why not, for them.

    `proposer` is the person who proposed the change being approved or rejected (four-eyes:
    the proposer cannot approve their own change, but may withdraw it by rejecting).
    `channels` are the chat's (`[slack] channels`); the terminal is not a channel. `ids` is
    the front end's identity part: which channels are private, how a channel is written.
    """
    if action not in ACTIONS:
        return Decision(False, f"unknown action {action!r}")
    if action == "approve" and policy is not None and policy.four_eyes and _own(proposer, who):
        return Decision(False, FOUR_EYES)
    if who.local:
        if policy is None or not policy.names_local:
            return ALLOW  # the local account owns the database (module docstring)
        return _by_role(policy, who, action, person(who.user), _no_group, proposer)
    if policy is None:
        return Decision(
            False,
            "this bot has no [access] section in kvpilot.toml, so nobody may use it from Slack",
        )
    if action == "help":
        return ALLOW
    if channels and who.channel not in channels and not _private(who, action, ids):
        allowed = ", ".join(ids.channel_link(c) for c in channels)
        return Decision(False, f"kvpilot only works in {allowed}")
    return _by_role(policy, who, action, who.user, group_members, proposer)


# Where only the person sees kvpilot: a direct message with the bot (the front end's
# `Identity.is_private`) and its App Home. Decisions may be made there (an approver's copy of a
# proposal, the Home tab's buttons), by the same roles; `[slack] channels` limits where
# commands are typed.
APP_HOME = "app_home"


def _private(who: Principal, action: Action, ids: Identity) -> bool:
    """A button of kvpilot's own in a person's direct messages or Home tab (a typed command
    there is held to `[slack] channels` like any other)."""
    where = who.channel or ""
    return who.button and action in DECIDING and (where == APP_HOME or ids.is_private(where))


def _by_role(
    policy: AccessPolicy,
    who: Principal,
    action: Action,
    entry: str,
    group_members: GroupMembers,
    proposer: str | None,
) -> Decision:
    """The roles' table: anyone reads, operators act, approvers also decide (`entry` is how
    `who` is spelled in `[access]`: a chat user ID or `local:NAME`)."""
    if action in READ_ONLY:
        return ALLOW
    approvers = _members(policy.approvers, group_members)
    if action == "reject" and _own(proposer, who):
        return ALLOW  # withdrawing one's own proposal
    hint = f'; add "{entry}" there' if who.local else ""
    if action in DECIDING:
        if entry in approvers:
            return ALLOW
        return Decision(
            False,
            f"only the approvers named in kvpilot.toml ([access] approvers) may {action}{hint}",
        )
    if entry in _members(policy.operators, group_members) or entry in approvers:
        return ALLOW
    return Decision(
        False,
        f"only operators and approvers may {action} ([access] operators / approvers in "
        f"kvpilot.toml){hint}",
    )
