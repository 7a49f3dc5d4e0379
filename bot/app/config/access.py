"""`[access]`: who may do what, in the chat and in the terminal alike; `[slack]`: where.

`[access]` lists approvers and operators as the chat service's IDs (people and user groups, as
the front end's `Identity` checks them) or local accounts (`"local:alice"`, the terminal's OS
users), with `four_eyes` and `approval_ttl`.
`bot.chat.auth.authorise` decides from it. `[slack]` keeps only `channels`; its older policy
keys still work, with a deprecation note naming the `[access]` key to move each to.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from bot.app.config.values import ConfigError, chat_ids, check_keys, duration, flag
from bot.chat.identity import Identity, Kind

LOCAL_PREFIX = "local:"
POLICY_KEYS = ("approvers", "operators", "four_eyes", "approval_ttl")
# a POSIX login name, as useradd accepts it by default
_ACCOUNT = re.compile(r"[a-z_][a-z0-9_.-]{0,31}\$?")
_TERMINAL_SPELLINGS = ("console:", "cli:")
PEOPLE: tuple[Kind, ...] = ("person", "group")
CHANNEL: tuple[Kind, ...] = ("channel",)


@dataclass(frozen=True)
class AccessPolicy:
    """Who may do what in every front end (decided by `bot.chat.auth.authorise`)."""

    approvers: tuple[str, ...] = ()
    operators: tuple[str, ...] = ()
    four_eyes: bool = False
    approval_ttl_s: float = 1800.0

    @property
    def names_local(self) -> bool:
        """Whether the terminal's accounts get only the roles listed (else they get every role)."""
        return any(entry.startswith(LOCAL_PREFIX) for entry in self.approvers + self.operators)


@dataclass(frozen=True)
class SlackConfig:
    """Where the Slack bot answers (any channel when empty)."""

    channels: tuple[str, ...] = ()


@dataclass(frozen=True)
class AccessSections:
    """The policy and Slack's channels, with a note for each key still in the old place."""

    access: AccessPolicy | None
    slack: SlackConfig | None
    deprecations: tuple[str, ...] = ()


def _local_account(entry: str, where: str) -> str:
    name = entry.removeprefix(LOCAL_PREFIX)
    if not _ACCOUNT.fullmatch(name):
        raise ConfigError(
            f"{where}: {entry!r} is not a local account; write local:NAME with NAME the OS "
            'login name as `id -un` prints it, e.g. "local:alice"'
        )
    return entry


def _example(ids: Identity) -> str:
    person = ids.examples.get("person")
    return f'"{person}", ' if person else ""


def _entries(table: dict[str, Any], key: str, where: str, ids: Identity) -> tuple[str, ...]:
    """The chat's person or group IDs and `local:NAME` accounts, each checked with its rule."""
    value = table.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(
            f"{where}.{key}: expected a list of {ids.service} IDs or local accounts, e.g. "
            f'[{_example(ids)}"local:alice"]'
        )
    for entry in value:
        for spelling in _TERMINAL_SPELLINGS:
            if entry.startswith(spelling):
                raise ConfigError(
                    f"{where}.{key}: {entry!r}: write {LOCAL_PREFIX}{entry.removeprefix(spelling)}"
                    " (an account is one person in the console and on the command line)"
                )
        if entry.lower().startswith(LOCAL_PREFIX):
            _local_account(entry, f"{where}.{key}")
        elif ids.problem(entry, PEOPLE) is None:
            continue
        elif _ACCOUNT.fullmatch(entry):
            person = ids.examples.get("person")
            like = f' like "{person}"' if person else ""
            raise ConfigError(
                f"{where}.{key}: {entry!r} is neither a {ids.service} ID nor a local account: "
                f'write "{LOCAL_PREFIX}{entry}" for the OS user, or a {ids.service} user ID{like}'
            )
        else:
            chat_ids({key: [entry]}, key, where, PEOPLE, ids)
    return tuple(value)


def policy(
    table: dict[str, Any], where: str, ids: Identity, *, legacy: bool = False
) -> AccessPolicy:
    """The policy keys of `table` (`[access]`, or `[slack]` when `legacy`), checked."""
    read = AccessPolicy(
        approvers=_entries(table, "approvers", where, ids),
        operators=_entries(table, "operators", where, ids),
        four_eyes=flag(table, "four_eyes", where),
        approval_ttl_s=duration(table, "approval_ttl", where, 1800.0),
    )
    if not read.approvers and (legacy or read.four_eyes or read.names_local):
        raise ConfigError(f"{where}.approvers: {_why_an_approver(read, legacy, ids)}")
    return read


def _approvers_example(ids: Identity) -> str:
    """`(Slack user IDs like "…", a user group like "…", or "local:alice")`, from `ids`."""
    person, group = ids.examples.get("person"), ids.examples.get("group")
    chat = [f'{ids.service} user IDs like "{person}"'] if person else []
    chat += [f'a user group like "{group}"'] if group else []
    return "(" + ", ".join([*chat, 'or "local:alice"' if chat else '"local:alice"']) + ")"


def _why_an_approver(read: AccessPolicy, legacy: bool, ids: Identity) -> str:
    example = _approvers_example(ids)
    if read.four_eyes:
        return (
            f"name at least one approver {example}: four_eyes is on, so every change waits "
            "for an approver other than its proposer"
        )
    if read.names_local:
        return (
            f"name at least one approver {example}: local accounts are listed, so the "
            "terminal's accounts get only the roles listed and nobody could approve a change"
        )
    assert legacy
    return f"name at least one approver {example}; without one nothing can ever be approved"


def _deprecations(path: str, keys: list[str]) -> tuple[str, ...]:
    return tuple(
        f"{path}: [slack] {key} is deprecated; move it to [access] {key} (same value); "
        "[slack] keeps only channels"
        for key in keys
    )


def sections(access: Any, slack: Any, path: str, ids: Identity) -> AccessSections:
    """`[access]` and `[slack]` read together: the policy is in one of them, never both."""
    for name, table in (("access", access), ("slack", slack)):
        if table is not None and not isinstance(table, dict):
            raise ConfigError(f"{name}: expected a table")
    if access is not None:
        check_keys(access, set(POLICY_KEYS), "access")
    if slack is not None:
        check_keys(slack, {"channels", *POLICY_KEYS}, "slack")
    old = [key for key in POLICY_KEYS if slack is not None and key in slack]
    if old and access is not None:
        moved = ", ".join(f"slack.{key}" for key in old)
        raise ConfigError(
            f"{moved} and [access] both say who may do what: keep [access] (move any of "
            f"{moved} it lacks there) and delete {moved} from [slack]"
        )
    channels = (
        None if slack is None else SlackConfig(chat_ids(slack, "channels", "slack", CHANNEL, ids))
    )
    if access is not None:
        return AccessSections(policy(access, "access", ids), channels)
    if old:
        return AccessSections(
            policy(slack, "slack", ids, legacy=True), channels, _deprecations(path, old)
        )
    return AccessSections(None, channels)
