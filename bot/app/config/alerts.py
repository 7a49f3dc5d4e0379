"""`[alerts]`: where proactive alerts go, and when a condition is posted and cleared.

`[alerts]`: kvpilot speaks up, unasked, when a server turns KV-bound, when its throughput
falls against the same hours a week before, and when an experiment ends `failed`.

    [alerts]
    channel = "ID"             # the channel alerts go to; else the first of [slack] channels
    raise_after = "10m"        # a condition must hold this long before it is posted (once)
    clear_after = "10m"        # ... and be gone this long before it may be posted again
    regression = 0.2           # a fall of 20% against a week before; 0 turns it off
    group_window = "10m"       # alerts within this of a channel's newest alert message join it
    enabled = true
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bot.app.config.values import ConfigError, chat_ids, check_keys, duration, flag, number
from bot.chat.identity import Identity


@dataclass(frozen=True)
class AlertsConfig:
    enabled: bool = True
    channel: str | None = None
    raise_after_s: float = 600.0
    clear_after_s: float = 600.0
    regression: float = 0.2
    group_window_s: float = 600.0


def alerts(table: Any, ids: Identity) -> AlertsConfig:
    if table is None:
        return AlertsConfig()
    where = "alerts"
    if not isinstance(table, dict):
        example = ids.examples.get("channel", "CHANNEL")
        raise ConfigError(f'{where}: expected a table, e.g. [alerts] channel = "{example}"')
    keys = {"enabled", "channel", "raise_after", "clear_after", "regression", "group_window"}
    check_keys(table, keys, where)
    channel = table.get("channel")
    if channel is not None:
        (channel,) = chat_ids({"channel": [channel]}, "channel", where, ("channel",), ids)
    regression = number(table, "regression", where, AlertsConfig.regression, positive=False)
    assert regression is not None
    if not 0 <= regression < 1:
        raise ConfigError(
            f"{where}.regression: a fall as a share, 0.2 for 20% (0 turns it off), got {regression}"
        )
    return AlertsConfig(
        enabled=flag(table, "enabled", where) if "enabled" in table else True,
        channel=channel,
        raise_after_s=duration(table, "raise_after", where, AlertsConfig.raise_after_s),
        clear_after_s=duration(table, "clear_after", where, AlertsConfig.clear_after_s),
        regression=float(regression),
        group_window_s=duration(table, "group_window", where, AlertsConfig.group_window_s),
    )
