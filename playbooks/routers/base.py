"""The router seam: what kvpilot asks of a router in front of a group of servers.

A restart behind a router is request-safe when the server leaves the rotation first (the router
sends it no new requests), its running requests finish, and it returns only once it serves again.
Each router kind answers three questions about one worker (the server as the router knows it, by
URL): is it in the rotation, take it out, put it back. Taking out and putting back are
idempotent, so a bot that crashed between a call and its record can simply call again.

`entry` is read before a worker is taken out and kept with the record, so a router that needs
more than the URL to add a worker back (vLLM's production-stack router: the served model's name)
gets it back even after kvpilot restarted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class RouterError(Exception):
    """The router could not be asked, or refused: the message says which and what to do."""


class Router(Protocol):
    """A router in front of a group (`[groups.NAME.router]`)."""

    @property
    def kind(self) -> str:
        """The configuration name (`kind = "sglang"`)."""
        ...

    @property
    def url(self) -> str: ...

    def listed(self, worker: str) -> bool:
        """Whether the router routes to `worker` now (raises RouterError)."""
        ...

    def entry(self, worker: str) -> dict[str, Any]:
        """What `add` needs besides the URL to put `worker` back, read before it is removed."""
        ...

    def remove(self, worker: str) -> str:
        """Take `worker` out of the rotation (nothing happens if it is out); what was done."""
        ...

    def add(self, worker: str, entry: Mapping[str, Any]) -> str:
        """Put `worker` back (nothing happens if it is in); what was done."""
        ...


def same_url(a: str, b: str) -> bool:
    """Routers echo a worker's URL as they were given it, at most with a trailing slash."""
    return a.rstrip("/") == b.rstrip("/")
