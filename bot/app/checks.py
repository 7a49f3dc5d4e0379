"""One check of `kvpilot doctor` (and of `kvpilot serve`'s start): what was found, and the fix."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    area: str  # "config", "database", "slack", "server NAME"
    ok: bool
    detail: str
    fix: str = ""
