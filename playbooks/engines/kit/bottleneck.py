"""The skeleton of an engine's bottleneck analysis: its rules are the engine's, the walk is shared.

An engine lists its rules in priority order (a `Table`: the bottleneck each names and a function
of its `Signals` returning the deciding sentence, or None); `Table.analyse` takes the first that
matches. The sentences every engine says alike (nobody waits; the KV pool is full) are here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from playbooks.engines.types import Bottleneck, Measurement

S = TypeVar("S")
X = TypeVar("X")
FILLING_RISE = 0.15  # usage rising by more than this over the window: the server is filling up

NOTHING_WAITS = (
    "nothing waits: the server takes every request the clients send, so "
    "throughput equals the offered load and no server change can raise it"
)


def usage_reached(m: Measurement) -> tuple[float | None, str]:
    """Where KV usage got to (a filling server is judged by its end, not its ramp), and the
    window's mean usage as reported."""
    usage = m.token_usage
    text = "unknown" if usage is None else f"{usage:.2f}"
    if usage is not None and m.usage_trend is not None and m.usage_trend[1] > usage:
        usage = m.usage_trend[1]
    return usage, text


def nothing_waits(m: Measurement, *, other_waits: bool = False) -> str | None:
    """Client-bound: no queue to speak of (and nothing the engine counts apart waiting)."""
    if m.queue_nonempty_fraction < 0.2 and m.queued < 1 and not other_waits:
        return NOTHING_WAITS
    return None


def prompts_dominate(m: Measurement, ratio: float, where: str) -> str | None:
    """Prefill-bound: more than `ratio` prompt tokens per output token (`where` says what has
    room, and what limits, in the engine's words)."""
    prompt, output = m.prompt_tokens_per_s, m.effective
    if prompt and output and output.mean > 0 and prompt > ratio * output.mean:
        return (
            f"prompts dominate ({prompt:,.0f} prompt tok/s vs {output.mean:,.0f} output tok/s) "
            f"while {where}"
        )
    return None


@dataclass(frozen=True)
class KvFull:
    """KV-bound: the pool at `saturated` or more, or at `evicting_usage` while running requests
    are pushed out; `pool` and `evicted` are the engine's words for its pool and for pushing
    out (retracted, preempted)."""

    saturated: float
    evicting_usage: float
    pool: str
    evicted: str

    def says(self, usage: float | None, evicting: bool) -> str | None:
        if usage is None or not (
            usage >= self.saturated or (evicting and usage >= self.evicting_usage)
        ):
            return None
        return (
            f"requests wait while the {self.pool} is {usage:.0%} used"
            + (f" and running requests are being {self.evicted}" if evicting else "")
            + ": admission is limited by KV-cache capacity"
        )


Rule = Callable[[S], str | None]
Rows = tuple[tuple[Bottleneck, Rule[S]], ...]  # (the bottleneck a rule names, the rule)


@dataclass(frozen=True)
class Table(Generic[X, S]):
    """An engine's bottleneck table. The first rows are every engine's, in this order: nobody
    waits (`client`); requests wait for something no KV change shortens (`held_apart`, named
    `unknown`); the KV pool is full (`kv`). `then` are the engine's own rows, in priority order,
    and `otherwise` what is left when requests wait and no row explains it. `signals` reads a
    context's numbers once; `evidence` is what was measured, before any conclusion."""

    signals: Callable[[X], S]
    evidence: Callable[[X], list[str]]
    client: Rule[S]
    held_apart: Rule[S]
    kv: Rule[S]
    then: Rows[S]
    otherwise: Callable[[S], str]

    @property
    def rules(self) -> Rows[S]:
        """Every row, in priority order: the first that matches names the bottleneck."""
        return (("client", self.client), ("unknown", self.held_apart), ("kv_cache", self.kv),
                *self.then)  # fmt: skip

    def analyse(self, ctx: X) -> tuple[Bottleneck, list[str]]:
        """The bottleneck and the evidence for it, the deciding sentence last."""
        s = self.signals(ctx)
        found = self.evidence(ctx)
        for bottleneck, rule in self.rules:
            because = rule(s)
            if because is not None:
                return bottleneck, [*found, because]
        return "unknown", [*found, self.otherwise(s)]
