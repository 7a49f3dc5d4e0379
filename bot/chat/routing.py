"""What a proposal says about the requests its restart affects, when a router is in front."""

from __future__ import annotations

from bot.app.config import Config


def drain_text(config: Config, server: str) -> str | None:
    """How the restart treats running requests behind the group's router; None without one
    (the proposal then says how many requests the restart drops)."""
    cfg = config.servers.get(server)
    group = None if cfg is None or cfg.group is None else config.groups.get(cfg.group)
    router = None if group is None else group.router
    if router is None:
        return None
    return (
        f"`{server}` leaves the rotation of the {router.kind} router at {router.url} first; its "
        f"running requests finish (for up to {router.drain_timeout_s:g} s, then the rest are "
        "dropped), and it rejoins once it is ready again"
    )
