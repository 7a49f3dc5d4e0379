"""The check of one launch argument, as every engine writes it: two halves, apart.

`safety(change, value)` reads only the server's facts (what `judge` runs on a hand-typed
change, before anything is measured); `usefulness(change, value, seen)` reads the measurement
(`Observed`). An engine subclasses `Check` once for its own change type and writes its checks on
that; how their answers combine is `playbooks.engines.findings.collect`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from playbooks.engines.findings import NOTHING, Finding
from playbooks.engines.types import Bottleneck, Measurement


class ChangeLike(Protocol):
    """What the default halves read of an engine's change: the values asked for."""

    @property
    def values(self) -> Mapping[str, Any]: ...


C = TypeVar("C", bound=ChangeLike)


@dataclass(frozen=True)
class Observed:
    """What the usefulness half of a check reads: the measurement and the bottleneck it shows."""

    m: Measurement
    bottleneck: Bottleneck

    @property
    def kv_bound(self) -> bool:
        return self.bottleneck == "kv_cache"


class Check(Generic[C]):
    """The check of one launch argument (or of a few judged together).

    `predicts_gain`: whether the throughput predicted from KV capacity alone still holds when
    this argument changes. `fallback`: the check speaks only when no other check has a verdict,
    for arguments that ride along with a change rather than decide it.
    """

    names: tuple[str, ...] = ()
    predicts_gain = True
    fallback = False

    def applies(self, change: C) -> bool:
        return any(name in change.values for name in self.names)

    def value(self, change: C) -> Any:
        """What the halves judge: the argument's new value unless a check says otherwise."""
        return change.values.get(self.names[0])

    def safety(self, ctx: C, value: Any) -> Finding:
        """Whether the server starts and keeps running with it: no measurement needed."""
        return NOTHING

    def usefulness(self, ctx: C, value: Any, seen: Observed) -> Finding:
        """Whether it addresses what the measurement shows."""
        return NOTHING

    def predicts_gain_for(self, change: C) -> bool:
        """`predicts_gain` for this change (a check may predict for some of its changes)."""
        return self.predicts_gain


class UnknownArgument(Check[Any]):
    """An argument no check covers: refused, since nothing says it is safe."""

    predicts_gain = False

    def __init__(self, name: str) -> None:
        self.names = (name,)

    def safety(self, ctx: Any, value: Any) -> Finding:
        return Finding(
            "unsafe",
            (f"kvpilot has no rule for {self.names[0]}, so it cannot say the change is safe",),
        )


def table(checks: Iterable[Check[C]]) -> dict[str, Check[C]]:
    """Argument name -> its check, in the order given (a check of several arguments under each)."""
    return {name: check for check in checks for name in check.names}


def checks_for(
    checks: Mapping[str, Check[C]], change: C, first: Sequence[Check[C]] = ()
) -> list[Check[C]]:
    """The checks a change calls on, each once: those of `first` that apply, then the table's
    in table order, then an `UnknownArgument` for each argument no check covers."""
    known = [check for check in first if check.applies(change)]
    known += [check for check in dict.fromkeys(checks.values()) if check.applies(change)]
    unknown: list[Check[C]] = [UnknownArgument(n) for n in change.values if n not in checks]
    return known + unknown


def capacity_grows(tokens: int, current: int, seen: Observed) -> Finding | None:
    """Not useful where the KV capacity would not grow, or grows for a server that is not
    KV-bound; None where more capacity addresses the bottleneck."""
    if tokens <= current:
        return Finding(
            "not_useful", (f"capacity would not grow ({tokens:,} vs {current:,} tokens)",)
        )
    if not seen.kv_bound:
        return Finding(
            "not_useful",
            (
                f"capacity would grow to {tokens:,} tokens, but the bottleneck is "
                f"{seen.bottleneck}, not the KV cache",
            ),
        )
    return None
