"""One check of `kvpilot doctor` (and of `kvpilot serve`'s start): what was found, and the fix."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    area: str  # "config", "database", "slack", "server NAME"
    ok: bool
    detail: str
    fix: str = ""
    # `kvpilot serve` refuses to start on a fatal failure (the database, the Slack token);
    # the others (a server down, a channel to join) it logs and starts anyway
    fatal: bool = False
