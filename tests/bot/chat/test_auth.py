"""`authorise`: one policy for Slack, the console and the command line, table by table."""

from __future__ import annotations

import pytest

from bot.app.config import AccessPolicy
from bot.chat.auth import Action, Principal, authorise

GROUPS = {"S1": frozenset({"U5"})}


def allowed(
    policy: AccessPolicy | None,
    user: str,
    action: str,
    *,
    channel: str | None = "C1",
    proposer: str | None = None,
    channels: tuple[str, ...] = ("C1",),
) -> bool:
    return authorise(
        policy,
        Principal(user, channel),
        action,  # type: ignore[arg-type]  # unknown actions are part of the table
        group_members=lambda g: GROUPS.get(g, frozenset()),
        proposer=proposer,
        channels=channels,
    ).allowed


def test_authorise_roles_channels_groups_and_four_eyes() -> None:
    policy = AccessPolicy(approvers=("U2", "S1"), operators=("U1",), four_eyes=True)

    def ok(user: str, action: str, channel: str = "C1", proposer: str | None = None) -> bool:
        return allowed(policy, user, action, channel=channel, proposer=proposer)

    assert ok("U9", "help") and ok("U9", "status") and not ok("U9", "diagnose")
    assert ok("U1", "propose") and not ok("U1", "approve") and ok("U5", "approve")
    assert not ok("U1", "propose", channel="C2")
    assert not ok("U2", "approve", proposer="U2") and ok("U2", "reject", proposer="U2")
    assert ok("console:me", "approve") and not ok("console:me", "approve", proposer="console:me")
    # one account is one person, whichever terminal front end it proposed from
    assert not ok("cli:me", "approve", proposer="console:me") and ok("cli:you", "approve")
    assert not authorise(
        None, Principal("U1", "C1"), "status", group_members=lambda g: frozenset()
    ).allowed


LISTED = AccessPolicy(
    approvers=("U2", "local:alice"), operators=("local:bob", "U1"), four_eyes=True
)
SLACK_ONLY = AccessPolicy(approvers=("U2",), operators=("U1",), four_eyes=True)
NO_FOUR_EYES = AccessPolicy(approvers=("local:alice",), operators=("local:bob",))


@pytest.mark.parametrize(
    ("policy", "user", "action", "proposer", "expected"),
    [
        # local accounts listed: exactly the roles the lists give them
        (LISTED, "cli:alice", "approve", "cli:bob", True),
        (LISTED, "console:alice", "abort", None, True),
        (LISTED, "cli:bob", "propose", None, True),
        (LISTED, "cli:bob", "restart", None, True),
        (LISTED, "cli:bob", "approve", "U1", False),
        (LISTED, "console:bob", "reject", "U1", False),
        (LISTED, "console:bob", "reject", "cli:bob", True),  # withdrawing one's own
        # four-eyes holds for a local approver, from either terminal front end
        (LISTED, "cli:alice", "approve", "cli:alice", False),
        (LISTED, "console:alice", "approve", "cli:alice", False),
        (LISTED, "cli:alice", "approve", "U1", True),
        # an unlisted local account may only read
        (LISTED, "cli:carol", "help", None, True),
        (LISTED, "cli:carol", "status", None, True),
        (LISTED, "console:carol", "history", None, True),
        (LISTED, "cli:carol", "diagnose", None, False),
        (LISTED, "cli:carol", "propose", None, False),
        (LISTED, "cli:carol", "abort", None, False),
        (LISTED, "cli:carol", "restart", None, False),
        (LISTED, "console:carol", "approve", "U1", False),
        # Slack users are untouched by the local entries
        (LISTED, "U2", "approve", "cli:bob", True),
        (LISTED, "U1", "approve", "cli:bob", False),
        (LISTED, "U9", "propose", None, False),
        # none listed: the local account keeps every role, four-eyes still holding
        (SLACK_ONLY, "cli:carol", "approve", "U1", True),
        (SLACK_ONLY, "console:carol", "restart", None, True),
        (SLACK_ONLY, "cli:carol", "approve", "console:carol", False),
        (None, "cli:carol", "approve", "cli:carol", True),
        (None, "U2", "help", None, False),
        # without four-eyes a listed approver may approve their own change
        (NO_FOUR_EYES, "cli:alice", "approve", "cli:alice", True),
        (NO_FOUR_EYES, "cli:bob", "approve", "cli:bob", False),
        (LISTED, "cli:alice", "launch", None, False),
    ],
)
def test_local_accounts_get_the_roles_listed(
    policy: AccessPolicy | None, user: str, action: Action, proposer: str | None, expected: bool
) -> None:
    # the terminal is not a Slack channel: the channel list never applies to it
    channel = "C1" if user.startswith("U") else "local"
    assert allowed(policy, user, action, channel=channel, proposer=proposer) is expected


@pytest.mark.parametrize(
    ("user", "action", "needle"),
    [
        ("cli:carol", "propose", "only operators and approvers may propose"),
        ("cli:carol", "propose", 'add "local:carol" there'),
        ("console:bob", "approve", "only the approvers named in kvpilot.toml ([access] approvers)"),
        ("cli:alice", "approve", "four-eyes is on"),
        ("U9", "abort", "([access] operators / approvers in kvpilot.toml)"),
    ],
)
def test_refusals_say_which_list_to_join(user: str, action: Action, needle: str) -> None:
    decision = authorise(
        LISTED,
        Principal(user, "C1"),
        action,
        group_members=lambda g: frozenset(),
        proposer="cli:alice" if action == "approve" else None,
    )
    assert not decision.allowed and needle in decision.reason


def test_slack_channels_apply_to_slack_users_only() -> None:
    assert not allowed(LISTED, "U1", "propose", channel="C2")
    assert allowed(LISTED, "U1", "propose", channel="C2", channels=())
    assert allowed(LISTED, "cli:bob", "propose", channel=None)
    assert (
        not authorise(
            None, Principal("U1", "C1"), "help", group_members=lambda g: frozenset()
        ).reason.find("[access]")
        < 0
    )
