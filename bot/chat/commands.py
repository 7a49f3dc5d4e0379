"""Parsing `/kvpilot` text into a command, with errors that say how to fix them.

Parsing is pure and fast, so a mistake is answered within Slack's 3 s acknowledgement.
"""

from __future__ import annotations

import difflib
import re
import shlex
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from bot.app.config import Config, ConfigError, parse_duration
from bot.app.wiring import engine
from playbooks.campaigns.policy import Allowance, PolicyError
from playbooks.engines.base import ArgError
from playbooks.reports.throughput import parse_window

USAGE = {
    "help": "help",
    "diagnose": "diagnose [server]",
    "propose": "propose <server> KEY=VALUE ... [--force]",
    "status": "status [server]",
    "abort": "abort <experiment id>",
    "approve": "approve <proposal id>",
    "reject": "reject <proposal id>",
    "history": "history [server]",
    "report": "report [server | --group NAME | --all] [--since 24h]",
    "tune": "tune <server> [--allow KEY=RANGE ...] [--max-experiments N]",
    "freeze": "freeze [server|group|all] [for 2h] [reason]",
    "unfreeze": "unfreeze [server|group]",
}
MAX_FREEZE_S = 30 * 86400.0


class CommandError(Exception):
    """A command the bot cannot run as typed; the message says what to type instead."""


@dataclass(frozen=True)
class Command:
    name: str
    server: str | None = None
    change: dict[str, Any] = field(default_factory=dict)
    force: bool = False
    experiment_id: int | None = None
    since: timedelta = timedelta(hours=24)  # the report's window, read as `kvpilot report` does
    proposal_id: int | None = None
    plan: dict[str, Any] | None = None  # a campaign's bounded plan (`tune`), as stored
    freeze: FreezeSpec | None = None  # `freeze` and `unfreeze`: what, for how long, why
    group: str | None = None  # `report --group NAME` (its name) or `--all` ("*")
    members: tuple[str, ...] = ()  # the servers of that report, in the configuration's order


@dataclass(frozen=True)
class FreezeSpec:
    scope: str  # "all", "server" or "group"
    target: str  # the server's or group's name; "*" for all
    for_s: float | None = None  # None: until lifted
    reason: str = ""


def _server(config: Config, name: str | None, *, required: bool, verb: str) -> str | None:
    if name is None:
        if len(config.servers) == 1:
            return next(iter(config.servers))
        if required or not config.servers:
            known = ", ".join(sorted(config.servers)) or "none configured"
            raise CommandError(f"which server? `/kvpilot {USAGE[verb]}` (servers: {known})")
        return None
    if name not in config.servers:
        known = ", ".join(sorted(config.servers)) or "none configured"
        raise CommandError(f"unknown server `{name}` (servers: {known})")
    return name


# ASCII only: str.isdigit() also takes "²" and "٣", which int() then refuses.
ASCII_DIGITS = re.compile(r"[0-9]+")
MAX_ID = 2**63 - 1  # SQLite's INTEGER; a larger id cannot name a record


def record_id(text: str) -> int | None:
    """`#123` or `123` as a record id (experiment, proposal), or None when it cannot be one.
    The chat's commands and the command line's arguments read ids with this one rule."""
    text = text.removeprefix("#")
    if not ASCII_DIGITS.fullmatch(text) or len(text) > 19 or int(text) > MAX_ID:
        return None
    return int(text)


def _record_id(args: list[str]) -> int | None:
    return record_id(args[0]) if len(args) == 1 else None


def parse_command(text: str, config: Config) -> Command:
    try:
        words = shlex.split(text.strip())
    except ValueError as exc:
        raise CommandError(f"cannot read that ({exc}); check your quotes") from None
    if not words or words[0] in ("help", "-h", "--help"):
        return Command("help")
    verb, args = words[0].lower(), words[1:]
    if verb not in USAGE:
        raise CommandError(f"unknown command `{verb}`; try `/kvpilot help`")
    if verb == "propose":
        force = "--force" in args
        args = [a for a in args if a != "--force"]
        if not args:
            raise CommandError(f"usage: `/kvpilot {USAGE[verb]}`")
        server = _server(config, args[0], required=True, verb=verb)
        assert server is not None  # required
        if len(args) < 2:
            raise CommandError(
                "nothing to change: add KEY=VALUE, e.g. "
                f"`/kvpilot propose {server} mem_fraction_static=0.88`"
            )
        try:
            change = engine(config.servers[server]).parse_change(args[1:])
        except ArgError as exc:
            raise CommandError(str(exc)) from None
        return Command(verb, server=server, change=change, force=force)
    if verb == "tune":
        return _tune(config, args)
    if verb in ("freeze", "unfreeze"):
        return _freeze(config, verb, args)
    if verb == "abort":
        exp_id = _record_id(args)
        if exp_id is None:
            raise CommandError(f"usage: `/kvpilot {USAGE[verb]}` (the id from `/kvpilot status`)")
        return Command(verb, experiment_id=exp_id)
    if verb in ("approve", "reject"):
        proposal_id = _record_id(args)
        if proposal_id is None:
            raise CommandError(
                f"usage: `/kvpilot {USAGE[verb]}` (the number in the proposal's message)"
            )
        return Command(verb, proposal_id=proposal_id)
    since = timedelta(hours=24)
    if verb == "report":  # `--since=2w` as the CLI's parser takes it
        args = [w for a in args for w in (a.split("=", 1) if a.startswith("--since=") else [a])]
    if verb == "report" and "--since" in args:
        i = args.index("--since")
        if i + 1 >= len(args):
            raise CommandError("--since needs a duration, e.g. `--since 24h`")
        try:
            since = parse_window(args[i + 1])
        except ValueError as exc:
            raise CommandError(f"--since: {exc}") from None
        args = args[:i] + args[i + 2 :]
    if verb == "report" and ("--all" in args or any(a.startswith("--group") for a in args)):
        return _group_report(config, args, since)
    if len(args) > 1:
        raise CommandError(f"too many words; usage: `/kvpilot {USAGE[verb]}`")
    required = verb in ("diagnose", "report")
    server = _server(config, args[0] if args else None, required=required, verb=verb)
    return Command(verb, server=server, since=since)


def _group_report(config: Config, args: list[str], since: timedelta) -> Command:
    """`report --group NAME` or `report --all`: one summary of many servers."""
    words = [w for a in args for w in (a.split("=", 1) if a.startswith("--group=") else [a])]
    if words == ["--all"]:
        if not config.servers:
            raise CommandError("no servers are configured to report on")
        return Command("report", since=since, group="*", members=tuple(config.servers))
    if len(words) != 2 or words[0] != "--group":
        raise CommandError(f"usage: `/kvpilot {USAGE['report']}`")
    name = words[1]
    if name not in config.groups:
        close = difflib.get_close_matches(name, sorted(config.groups), n=1)
        guess = f" (did you mean `{close[0]}`?)" if close else ""
        known = ", ".join(sorted(config.groups)) or "none configured; see [groups.NAME]"
        raise CommandError(f"unknown group `{name}`{guess}; groups: {known}")
    members = tuple(s for s, c in config.servers.items() if c.group == name)
    if not members:
        raise CommandError(f"group `{name}` has no servers (a server joins with group = ...)")
    return Command("report", since=since, group=name, members=members)


def _scope(config: Config, word: str) -> tuple[str, str] | None:
    if word in config.servers:
        return "server", word
    if word in config.groups:
        return "group", word
    if word == "all":
        return "all", "*"
    return None


def _unknown_target(config: Config, word: str, verb: str, said: str) -> str:
    """A first word that names no server or group: the closest name, the names there are, and
    how to freeze every server on purpose."""
    names = sorted([*config.servers, *config.groups])
    close = difflib.get_close_matches(word, names, n=1)
    guess = f" (did you mean `{close[0]}`?)" if close else ""
    known = ", ".join(names) or "none configured"
    return (
        f"unknown server or group `{word}`{guess}; servers and groups: {known}; to freeze every "
        f"server: `/kvpilot {verb} all {said}`"
    )


def _freeze(config: Config, verb: str, args: list[str]) -> Command:
    """`freeze [server|group|all] [for 2h] [reason]`: the first word names what is frozen (a
    server, a group, or `all`); with none, or `for` first, every server is; any other first
    word is refused as an unknown name. `unfreeze [server|group]`."""
    scope: tuple[str, str] | None = _scope(config, args[0]) if args else None
    rest = args[1:] if scope is not None else args
    if verb == "freeze" and scope is None and rest and rest[0].lower() != "for":
        # every server is frozen only when that is said (`all`, `for 2h`, or nothing at all):
        # a mistyped name must not freeze the whole fleet until someone notices
        raise CommandError(_unknown_target(config, args[0], verb, " ".join(args)))
    if verb == "unfreeze":
        if rest:
            known = ", ".join(sorted([*config.servers, *config.groups])) or "none configured"
            raise CommandError(
                f"unknown server or group `{rest[0]}`; usage: `/kvpilot {USAGE[verb]}` "
                f"(servers and groups: {known})"
            )
        scope_, target = scope or ("all", "*")
        return Command(verb, freeze=FreezeSpec(scope_, target))
    for_s = None
    if rest and rest[0].lower() == "for":
        if len(rest) < 2:
            raise CommandError("`for` needs a duration, e.g. `/kvpilot freeze for 2h incident`")
        try:
            for_s = parse_duration(rest[1], "for")
        except ConfigError as exc:
            raise CommandError(f"{exc}; e.g. `for 90m` or `for 2h`") from None
        if not 0 < for_s <= MAX_FREEZE_S:
            raise CommandError(
                "a freeze lasts more than nothing and at most 30 days; leave `for` out to "
                "freeze until `/kvpilot unfreeze`"
            )
        rest = rest[2:]
    scope_, target = scope or ("all", "*")
    reason = " ".join(rest)[:300]
    return Command(verb, freeze=FreezeSpec(scope_, target, for_s, reason))


def _tune(config: Config, args: list[str]) -> Command:
    """`tune <server> [--allow KEY=RANGE ...] [--max-experiments N]`: the command line's
    grammar (`kvpilot tune`), `--flag=value` spellings included."""
    words = [w for a in args for w in (a.split("=", 1) if a.startswith("--") and "=" in a else [a])]
    if not words or words[0].startswith("--"):
        raise CommandError(f"usage: `/kvpilot {USAGE['tune']}`")
    server = _server(config, words[0], required=True, verb="tune")
    allow: list[str] = []
    max_experiments = 3
    rest = words[1:]
    while rest:
        flag, rest = rest[0], rest[1:]
        if flag not in ("--allow", "--max-experiments") or not rest:
            raise CommandError(
                f"`{flag}` is not understood here; usage: `/kvpilot {USAGE['tune']}`"
            )
        value, rest = rest[0], rest[1:]
        if flag == "--allow":
            allow.append(value)
        elif not ASCII_DIGITS.fullmatch(value) or len(value) > 6:
            raise CommandError(f"--max-experiments needs a whole number, got `{value}`")
        else:
            max_experiments = int(value)
    try:
        plan = Allowance.parse(allow, max_experiments)
        serves = engine(config.servers[server or ""])
    except PolicyError as exc:
        raise CommandError(str(exc)) from None
    unknown = [key for key in plan.ranges if key not in serves.allowed_args()]
    if unknown:
        raise CommandError(
            f"`{unknown[0]}` is not an argument kvpilot may change "
            f"(it may: {', '.join(sorted(serves.allowed_args()))})"
        )
    if not plan.ranges:
        raise CommandError(
            "a plan names what it allows: add --allow KEY=RANGE, e.g. "
            f"`/kvpilot tune {server} --allow mem_fraction_static=0.85..0.92`"
        )
    return Command("tune", server=server, plan=plan.to_json())
