"""`kvpilot claims`: which bot owns which server; `claims release BOT` frees a dead bot's.

The claims are those of the estate's shared claims file (`[kvpilot] claims`, `storage/claims.py`).

A release of a live bot's claims needs `--force`: that bot still acts on its servers, and a
bot starting after the release could take them (the released bot logs each one it loses).
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any, TextIO

from bot.cli.output import add_output

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def add_claims_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "claims",
        help="the servers each bot of the estate claims ([kvpilot] claims); release BOT frees "
        "a dead bot's",
        description="`kvpilot claims` lists every claim in the shared claims file named by "
        "[kvpilot] claims; `kvpilot claims release BOT` frees the claims of a bot that is gone "
        "for good (a live bot's only with --force).",
    )
    p.add_argument("action", nargs="?", choices=("list", "release"), default="list")
    p.add_argument("bot", nargs="?", default=None, help="with release: the bot's name")
    p.add_argument("--config", default=None, help="kvpilot.toml (it names the claims file)")
    p.add_argument(
        "--force",
        action="store_true",
        help="with release: also release a bot that renewed within its lease (still running)",
    )
    add_output(p, "with list: print one JSON object")


def cmd_claims(
    ns: argparse.Namespace, out: TextIO, err: TextIO, now: datetime | None = None
) -> int:
    from bot.app.claims import LEASE_S, ago  # noqa: PLC0415 - keeps `diagnose` free of storage
    from bot.app.config import ConfigError, load  # noqa: PLC0415
    from bot.cli.chat import CHAT_IDS  # noqa: PLC0415
    from storage import claims as store  # noqa: PLC0415
    from storage.errors import StorageError  # noqa: PLC0415

    now = now or datetime.now(UTC)
    if (ns.action == "release") != (ns.bot is not None):
        err.write(
            "error: name the bot only with release: `kvpilot claims` lists the claims, "
            "`kvpilot claims release BOT` frees a bot's\n"
        )
        return EXIT_USAGE
    try:
        config = load(ns.config, ids=CHAT_IDS)
        if config.claims is None:
            raise ConfigError(
                f"{config.path} names no claims file, so this bot claims nothing: add "
                '[kvpilot] claims = "/var/lib/kvpilot/claims.db" (the file every bot of the '
                "estate shares; docs/operations.md)"
            )
        db = store.open_claims(config.claims.path)
    except (ConfigError, StorageError) as exc:
        err.write(f"error: {exc}\n")
        return EXIT_USAGE
    try:
        if ns.action == "list":
            return _list(store.all_claims(db), config.claims.bot_name, now, ns.json, out)
        holder = store.holder_of(db, ns.bot)
        held = [c for c in store.all_claims(db) if c.bot == ns.bot]
        if holder is None and not held:
            bots = sorted({c.bot for c in store.all_claims(db)})
            err.write(
                f"error: bot {ns.bot!r} holds no claims in {config.claims.path} (bots holding "
                f"claims: {', '.join(bots) or 'none'}); `kvpilot claims` lists them\n"
            )
            return EXIT_USAGE
        if holder is not None and holder.live(now, LEASE_S):
            if not ns.force:
                err.write(
                    f'error: bot "{ns.bot}" is live (host {holder.host}, pid {holder.pid}, '
                    f"{ago(holder.age_s(now))}): it still restarts, tunes and samples its "
                    "servers. Stop it first (its clean stop releases its claims), or pass "
                    "--force if it is gone for good and only its heartbeat is misleading\n"
                )
                return EXIT_USAGE
            err.write(
                f'warning: releasing the claims of live bot "{ns.bot}": until it stops, '
                "another bot may take its servers and both would act on them (it logs each "
                "server it loses; at its next renewal it takes back those still free)\n"
            )
        released = store.release_bot(db, ns.bot)
        out.write(
            f'released {released} claim(s) of bot "{ns.bot}"; another bot configured with '
            "those servers may start now\n"
        )
        return EXIT_OK
    except StorageError as exc:
        err.write(f"error: {exc}\n")
        return EXIT_FAILED
    finally:
        db.close()


def _list(claims: list[Any], me: str, now: datetime, as_json: bool, out: TextIO) -> int:
    from bot.app.claims import LEASE_S, ago  # noqa: PLC0415

    if as_json:
        rows = [
            {
                "url": c.url,
                "server": c.server,
                "bot": c.bot,
                "claimed_at": c.claimed_at.isoformat(),
                "host": c.holder.host,
                "pid": c.holder.pid,
                "renewed_s_ago": c.holder.age_s(now),
                "live": c.holder.live(now, LEASE_S),
            }
            for c in claims
        ]
        out.write(json.dumps({"bot": me, "lease_s": LEASE_S, "claims": rows}) + "\n")
        return EXIT_OK
    if not claims:
        out.write("no claims: no bot of this estate is running\n")
        return EXIT_OK
    bot = None
    for c in claims:
        if c.bot != bot:
            bot, h = c.bot, c.holder
            state = "live" if h.live(now, LEASE_S) else "lapsed: another bot may take these"
            this = " (this configuration)" if bot == me else ""
            out.write(
                f'bot "{bot}"{this}, host {h.host}, pid {h.pid}, {ago(h.age_s(now))} ({state})\n'
            )
        out.write(f"  {c.server:20} {c.url}\n")
    return EXIT_OK
