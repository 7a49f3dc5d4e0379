"""`[access]`, and the older policy keys in `[slack]`: every mistake named with its fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bot.app.config import AccessPolicy, ConfigError, SlackConfig, announce, load, parse
from bot.slack.identity import SLACK


def read(tmp_path: Path, **tables: Any) -> Any:
    return parse(tables, tmp_path / "kvpilot.toml", ids=SLACK)


@pytest.mark.parametrize(
    ("tables", "access", "slack", "notes"),
    [
        ({}, None, None, 0),
        (
            {"access": {"approvers": ["U2", "local:alice"], "operators": "local:bob"}},
            AccessPolicy(approvers=("U2", "local:alice"), operators=("local:bob",)),
            None,
            0,
        ),
        (
            {
                "access": {"approvers": ["S0APPROVE"], "four_eyes": True, "approval_ttl": "2h"},
                "slack": {"channels": ["C1"]},
            },
            AccessPolicy(approvers=("S0APPROVE",), four_eyes=True, approval_ttl_s=7200.0),
            SlackConfig(channels=("C1",)),
            0,
        ),
        ({"access": {}}, AccessPolicy(), None, 0),
        ({"slack": {"channels": ["C1"]}}, None, SlackConfig(channels=("C1",)), 0),
        # the older place: still read, one note per key
        (
            {"slack": {"approvers": ["U2"], "four_eyes": True, "channels": ["C1"]}},
            AccessPolicy(approvers=("U2",), four_eyes=True),
            SlackConfig(channels=("C1",)),
            2,
        ),
        (
            {"slack": {"approvers": ["U2"], "operators": ["U1"], "approval_ttl": "1m"}},
            AccessPolicy(approvers=("U2",), operators=("U1",), approval_ttl_s=60.0),
            SlackConfig(),
            3,
        ),
    ],
)
def test_the_policy_is_read_from_access_or_the_older_slack_keys(
    tmp_path: Path,
    tables: dict[str, Any],
    access: AccessPolicy | None,
    slack: SlackConfig | None,
    notes: int,
) -> None:
    config = read(tmp_path, **tables)
    assert (config.access, config.slack, len(config.deprecations)) == (access, slack, notes)
    assert config.channels == (slack.channels if slack else ())


def test_each_older_key_is_named_with_its_new_place(tmp_path: Path) -> None:
    config = read(tmp_path, slack={"approvers": ["U2"], "four_eyes": True})
    assert config.deprecations == (
        f"{tmp_path / 'kvpilot.toml'}: [slack] approvers is deprecated; move it to [access] "
        "approvers (same value); [slack] keeps only channels",
        f"{tmp_path / 'kvpilot.toml'}: [slack] four_eyes is deprecated; move it to [access] "
        "four_eyes (same value); [slack] keeps only channels",
    )


def test_the_note_is_shown_once_per_process(tmp_path: Path) -> None:
    path = tmp_path / "once.toml"
    path.write_text('[slack]\napprovers = ["U7"]\n')
    notes: list[str] = []
    load(str(path), warn=notes.append)
    load(str(path), warn=notes.append)
    announce(load(str(path)), notes.append)
    assert len(notes) == 1 and "[slack] approvers is deprecated" in notes[0]


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        (
            {"access": {"approvers": ["U2"]}, "slack": {"approvers": ["U2"], "four_eyes": True}},
            "slack.approvers, slack.four_eyes and [access] both say who may do what: keep [access]",
        ),
        ({"access": {"approver": ["U2"]}}, "access: unknown key(s) approver; allowed: "),
        ({"slack": {"roles": ["U2"]}}, "slack: unknown key(s) roles; allowed: approval_ttl"),
        ({"access": ["U2"]}, "access: expected a table"),
        ({"access": {"approvers": [1]}}, "access.approvers: expected a list of Slack IDs or"),
        ({"access": {"four_eyes": "yes"}}, "access.four_eyes: expected true or false"),
        ({"access": {"approval_ttl": True}}, "access.approval_ttl: expected a duration such as"),
        ({"access": {"approval_ttl": "soon"}}, "access.approval_ttl: 'soon' is not a duration"),
        (
            {"access": {"operators": ["alice"]}},
            "access.operators: 'alice' is neither a Slack ID nor a local account: write "
            '"local:alice"',
        ),
        (
            {"access": {"approvers": ["cli:alice"]}},
            "access.approvers: 'cli:alice': write local:alice",
        ),
        (
            {"access": {"approvers": ["console:alice"]}},
            "access.approvers: 'console:alice': write local:alice",
        ),
        ({"access": {"approvers": ["local:"]}}, "'local:' is not a local account; write"),
        ({"access": {"approvers": ["local:Al ice"]}}, "is not a local account"),
        ({"access": {"approvers": ["Local:alice"]}}, "'Local:alice' is not a local account"),
        ({"access": {"approvers": ["alice@example.com"]}}, "is not a Slack ID"),
        ({"access": {"approvers": ["C0CHANNEL"]}}, "'C0CHANNEL' is not a Slack ID"),
        (
            {"access": {"four_eyes": True}},
            "access.approvers: name at least one approver (Slack user IDs like "
            '"U0123ABCD", a user group like "S0123ABCD", or "local:alice"): four_eyes is on',
        ),
        (
            {"access": {"operators": ["local:bob"]}},
            "access.approvers: name at least one approver",
        ),
        ({"slack": {"operators": ["U1"]}}, "slack.approvers: name at least one approver"),
        ({"slack": {"channels": ["U1"]}}, "slack.channels: 'U1' is not a Slack ID"),
    ],
)
def test_bad_access_says_what_is_wrong_and_how_to_fix_it(
    tmp_path: Path, tables: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as exc:
        read(tmp_path, **tables)
    assert message in str(exc.value)
