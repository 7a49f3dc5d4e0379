"""What every engine's proposal table shares: the advice for a client-bound server, and the walk.

A server that ran everything it was sent, with nothing waiting, is limited by its clients: the
change to propose is more concurrent requests, on the client's side, whatever the engine. The
engine says how many requests of the observed size its pool holds (`requests_fitting`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from playbooks.engines.types import Bottleneck, Measurement, Option

X = TypeVar("X")


class Measured(Protocol):
    """What the client-bound proposal reads of an engine's context: its settings and the load."""

    @property
    def info(self) -> Any: ...

    @property
    def m(self) -> Measurement: ...


def client_bound(
    requests_fitting: Callable[[Any, Measurement], float | None],
) -> Callable[[Measured, Bottleneck], Option | None]:
    """The proposal for a client-bound server, over the engine's `requests_fitting`."""

    def more_clients(ctx: Measured, bottleneck: Bottleneck) -> Option | None:
        if bottleneck != "client":
            return None
        room = requests_fitting(ctx.info, ctx.m) or 0
        return Option(
            title="raise client concurrency",
            change={},
            verdict="recommended",
            predicted_max_total_num_tokens=None,
            predicted_gain=None,
            risk="none on the server",
            reasons=[
                f"only {ctx.m.running:.1f} requests ran and none waited: send more at once "
                f"(the server has room for ~{room:.0f})"
            ],
        )

    return more_clients


def propose(
    table: Sequence[Callable[[X, Bottleneck], Option | None]], ctx: X, bottleneck: Bottleneck
) -> list[Option]:
    """Every change the table's rules propose, in the table's order, each with its verdict."""
    return [o for rule in table if (o := rule(ctx, bottleneck)) is not None]
