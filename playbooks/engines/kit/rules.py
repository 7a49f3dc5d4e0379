"""The skeleton of an engine's rules for one server: `assess` and `judge`, over the engine's parts.

An engine's `ServerRules` is built before anything is measured (so a server kvpilot cannot
reason about fails before a window is spent on it) and supplies what it alone knows: its facts
before a measurement (`server`) and with one (`context`), its capacity facts, its rules
(`Parts`: the bottleneck table, proposals, verdicts), and whether a node is one it does not
judge (`apart`, a disaggregated prefill or decode node). The order of an assessment, the
changes asked for with `--consider` judged by the same checks as the bot's own proposals, is the
same for all.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, NamedTuple, TypeVar

from playbooks.engines.base import Assessment
from playbooks.engines.types import VERDICT_ORDER, Bottleneck, DiagnoseSettings, Measurement, Option
from playbooks.sources.host import HostMemory, HostUnavailable

Info = TypeVar("Info")
Cap = TypeVar("Cap")
X = TypeVar("X")
Srv = TypeVar("Srv")


class Capacity(NamedTuple):
    """The capacity facts an assessment carries beside its verdicts."""

    bytes_per_token: float
    gpu_memory_gib: float
    gpu_memory_source: str


def host_memory(settings: DiagnoseSettings, notes: list[str]) -> HostMemory | None:
    """The host's memory where a probe reads it; why not, in the notes, where it cannot."""
    if settings.host is None:
        return None
    try:
        return settings.host.memory()
    except HostUnavailable as exc:
        notes.append(f"host memory unknown ({exc})")
        return None


@dataclass(frozen=True)
class Parts(Generic[X, Srv]):
    """An engine's rules, as functions over its facts (`X`: its context with a measurement;
    `Srv`: its server's facts before one): the bottleneck table, the proposals, a change's
    verdict with a measurement and without, and how many requests' KV fits the pool."""

    analyse: Callable[[X], tuple[Bottleneck, list[str]]]
    propose: Callable[[X, Bottleneck], list[Option]]
    evaluate: Callable[[dict[str, Any], X, Bottleneck, bool], Option]
    judge: Callable[[Srv, dict[str, Any]], Option]
    requests_fitting: Callable[[Any, Measurement], float | None]  # (the server's settings, m)


@dataclass
class ServerRules(ABC, Generic[Info, Cap, X, Srv]):
    """The rules for one server: its settings (`info`), capacity model and host, read before
    anything is measured; an engine's subclass names its `parts`."""

    parts: ClassVar[Parts[Any, Any]]
    info: Info
    cap: Cap
    host: HostMemory | None
    settings: DiagnoseSettings
    notes: list[str]

    @property
    @abstractmethod
    def server(self) -> Srv:
        """The server's facts before any measurement: what a safety check may read."""

    @abstractmethod
    def context(self, m: Measurement) -> X:
        """The facts the bottleneck table and the proposals read: the server and `m`."""

    @abstractmethod
    def capacity(self) -> Capacity: ...

    def apart(self, ctx: X) -> tuple[list[str], str] | None:
        """A node whose rules kvpilot does not judge: the evidence it shows and why nothing is
        proposed; None for a server the rules judge (the default)."""
        del ctx
        return None

    def judge(self, change: dict[str, Any]) -> Option:
        """The safety verdict for one change without a measurement window (for experiments):
        the same safety checks as `evaluate`, and no usefulness."""
        return self.parts.judge(self.server, change)

    def assess(self, m: Measurement) -> Assessment:
        """The bottleneck, the changes that address it, and the capacity facts behind them."""
        ctx = self.context(m)
        apart = self.apart(ctx)
        if apart is not None:
            evidence, why = apart
            return self.assessment("unknown", evidence, [], None, [*self.notes, why])
        parts = self.parts
        bottleneck, evidence = parts.analyse(ctx)
        consider = self.settings.consider
        asked = [parts.evaluate(change, ctx, bottleneck, True) for change in consider]
        options = [o for o in parts.propose(ctx, bottleneck) if o.change not in consider] + asked
        ordered = sorted(options, key=lambda o: (o.considered, -VERDICT_ORDER[o.verdict]))
        return self.assessment(
            bottleneck, evidence, ordered, parts.requests_fitting(self.info, m), list(self.notes)
        )

    def assessment(
        self,
        bottleneck: Bottleneck,
        evidence: list[str],
        options: list[Option],
        requests_that_fit: float | None,
        notes: list[str],
    ) -> Assessment:
        capacity = self.capacity()
        return Assessment(
            bottleneck=bottleneck,
            evidence=evidence,
            options=options,
            bytes_per_token=capacity.bytes_per_token,
            gpu_memory_gib=capacity.gpu_memory_gib,
            gpu_memory_source=capacity.gpu_memory_source,
            requests_that_fit=requests_that_fit,
            notes=notes,
        )
