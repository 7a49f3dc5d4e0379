"""The approval checks as a table: one row per refusal, the go-ahead, and the order they run in."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from bot.app.config import AccessPolicy
from bot.chat.auth import Decision, Principal, authorise
from bot.chat.commands import USAGE
from bot.chat.decisions import (
    GO_AHEAD,
    Earlier,
    Outcome,
    ProposalFacts,
    Reason,
    Refusal,
    ServerFacts,
    Verb,
    args_of,
    judge_proposal,
    judge_server,
)
from bot.chat.dispatch import HANDLERS

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
POLICY = AccessPolicy(approvers=("U2",), operators=("U1",), four_eyes=True)
CHANNELS = ("C0OPS",)
ARGS = ("--model-path", "m", "--mem-fraction-static", "0.8")


def allowed(user: str, verb: Verb, proposer: str = "U1") -> Decision:
    """What `bot.chat.auth` says for `user` in the ops channel about U1's proposal."""
    who = Principal(user, "C0OPS")
    return authorise(
        POLICY,
        who,
        verb,
        group_members=lambda _: frozenset(),
        proposer=proposer,
        channels=CHANNELS,
    )


FINE = ProposalFacts(
    verb="approve",
    proposal_id=7,
    authorisation=allowed("U2", "approve"),
    button_hash="0123456789abcdef",
    stored_hash="0123456789abcdef" + "f" * 48,
    earlier=None,
    restarting=False,
    now=NOW,
    expires_at=NOW + timedelta(minutes=30),
)
IDLE = ServerFacts(
    server="incident",
    proposed_args=ARGS,
    current_args=ARGS,
    config_error=None,
    running_experiment=None,
)

Row = tuple[str, dict[str, object], Outcome]


def table(rows: list[Row]) -> pytest.MarkDecorator:
    """Parametrize a test by (name, changes to the facts, expected outcome) rows."""
    return pytest.mark.parametrize(
        ("changes", "expected"), [row[1:] for row in rows], ids=[row[0] for row in rows]
    )


FOUR_EYES = (
    "four-eyes is on: the person who proposed a change cannot approve it; ask another approver"
)
PROPOSAL_ROWS: list[Row] = [
    ("go ahead", {}, GO_AHEAD),
    (
        "four-eyes",
        {"authorisation": allowed("U1", "approve")},
        Refusal(Reason.NOT_AUTHORISED, FOUR_EYES),
    ),
    (
        "not an approver",
        {"authorisation": allowed("U3", "approve")},
        Refusal(
            Reason.NOT_AUTHORISED,
            "only the approvers named in kvpilot.toml ([access] approvers) may approve",
        ),
    ),
    (
        "another plan's button",
        {"button_hash": "fedcba9876543210"},
        Refusal(
            Reason.OTHER_PLAN,
            "this button is for a different plan than the one stored; propose again",
        ),
    ),
    (
        "already decided",
        {"earlier": Earlier("rejected", "U2")},
        Refusal(Reason.ALREADY_DECIDED, "proposal 7 was already rejected by {@U2}"),
    ),
    (
        "already decided in a terminal",
        {"earlier": Earlier("approved", "cli:alice")},
        Refusal(Reason.ALREADY_DECIDED, "proposal 7 was already approved by {@cli:alice}"),
    ),
    (
        "kvpilot restarting",
        {"restarting": True},
        Refusal(
            Reason.RESTARTING,
            "kvpilot is restarting; approve again once it is back",
            audited=False,
        ),
    ),
    (
        "expired on the minute",
        {"expires_at": NOW},
        Refusal(Reason.EXPIRED, "the proposal expired at 2025-03-01 12:00 UTC; propose it again"),
    ),
    # Checks that run first win when several would refuse.
    (
        "unauthorised and expired",
        {"authorisation": allowed("U3", "approve"), "expires_at": NOW},
        Refusal(
            Reason.NOT_AUTHORISED,
            "only the approvers named in kvpilot.toml ([access] approvers) may approve",
        ),
    ),
    (
        "another plan, already decided",
        {"button_hash": "fedcba9876543210", "earlier": Earlier("approved", "U2")},
        Refusal(
            Reason.OTHER_PLAN,
            "this button is for a different plan than the one stored; propose again",
        ),
    ),
    (
        "restarting and expired",
        {"restarting": True, "expires_at": NOW - timedelta(hours=1)},
        Refusal(
            Reason.RESTARTING,
            "kvpilot is restarting; approve again once it is back",
            audited=False,
        ),
    ),
    # A rejection is not held up by a restart or an expiry: withdrawing is always possible.
    (
        "reject while restarting, expired",
        {
            "verb": "reject",
            "authorisation": allowed("U2", "reject"),
            "restarting": True,
            "expires_at": NOW - timedelta(hours=1),
        },
        GO_AHEAD,
    ),
    (
        "proposer withdraws under four-eyes",
        {"verb": "reject", "authorisation": allowed("U1", "reject")},
        GO_AHEAD,
    ),
]


@table(PROPOSAL_ROWS)
def test_proposal_checks(changes: dict[str, object], expected: Outcome) -> None:
    assert judge_proposal(replace(FINE, **changes)) == expected  # type: ignore[arg-type]


CHANGED = (
    "the server's configuration changed since this was proposed (now: "
    "`--model-path m --mem-fraction-static 0.85`); propose again against the current "
    "configuration"
)
NOOP = (
    "nothing would change on `incident`: mem_fraction_static is already 0.88 "
    "(`--mem-fraction-static 0.88` in its launch arguments as its process launcher reports them)"
)
SERVER_ROWS: list[Row] = [
    ("go ahead", {}, GO_AHEAD),
    (
        "configuration unreadable",
        {"current_args": None, "config_error": "no container named sglang"},
        Refusal(
            Reason.CONFIG_UNREADABLE,
            "cannot read the server's configuration: no container named sglang",
        ),
    ),
    (
        "configuration changed",
        {"current_args": (*ARGS[:3], "0.85")},
        Refusal(Reason.CONFIG_CHANGED, CHANGED),
    ),
    (
        "proposal without stored arguments",
        {"proposed_args": None},
        Refusal(
            Reason.CONFIG_CHANGED,
            "the server's configuration changed since this was proposed (now: "
            f"`{' '.join(ARGS)}`); propose again against the current configuration",
        ),
    ),
    (
        "nothing would change on what runs now",
        {"unchanged": NOOP},
        Refusal(Reason.NOTHING_TO_CHANGE, f"{NOOP}; nothing was changed"),
    ),
    (
        # set by hand since the proposal: that nothing would change says more than "changed"
        "set by hand to what was proposed",
        {"current_args": (*ARGS[:3], "0.88"), "unchanged": NOOP},
        Refusal(Reason.NOTHING_TO_CHANGE, f"{NOOP}; nothing was changed"),
    ),
    (
        "unreadable comes first",
        {"current_args": None, "config_error": "timed out", "unchanged": NOOP},
        Refusal(Reason.CONFIG_UNREADABLE, "cannot read the server's configuration: timed out"),
    ),
    (
        "nothing to change and busy",
        {"unchanged": NOOP, "running_experiment": 12},
        Refusal(Reason.NOTHING_TO_CHANGE, f"{NOOP}; nothing was changed"),
    ),
    (
        "experiment running",
        {"running_experiment": 12},
        Refusal(Reason.SERVER_BUSY, "experiment 12 is already running on `incident`"),
    ),
    (
        "unreadable and busy",
        {"current_args": None, "config_error": "timed out", "running_experiment": 12},
        Refusal(Reason.CONFIG_UNREADABLE, "cannot read the server's configuration: timed out"),
    ),
    (
        "changed and busy",
        {"current_args": (), "running_experiment": 12},
        Refusal(
            Reason.CONFIG_CHANGED,
            "the server's configuration changed since this was proposed (now: ``); "
            "propose again against the current configuration",
        ),
    ),
]


@table(SERVER_ROWS)
def test_server_checks(changes: dict[str, object], expected: Outcome) -> None:
    assert judge_server(replace(IDLE, **changes)) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        (list(ARGS), ARGS),
        (["--port", 30000], ("--port", 30000)),  # kept as stored: a number is not its text
        (None, None),
        ("--model-path m", None),
    ],
)
def test_args_of_a_snapshot(stored: object, expected: tuple[object, ...] | None) -> None:
    assert args_of(stored) == expected


def test_every_command_has_a_handler() -> None:
    assert set(HANDLERS) == set(USAGE)
