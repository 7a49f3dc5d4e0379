"""A change's verdict from an engine's checks: `evaluate` with a measurement, `judge` without.

Both run the same safety halves, so `--consider KEY=VALUE`, the bot's own proposals and an
experiment's pre-flight agree on what is unsafe. The worst verdict of the parts wins; a part that
is unsafe is not asked whether it would also be useful (`playbooks.engines.findings.collect`).
What an engine supplies: its checks for a change, the throughput a change may buy, and the
option a judged change becomes (`Verdicts`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from playbooks.engines.findings import (
    FULL_POOL_USAGE,
    NOTHING_AGAINST,
    BatchCap,
    BatchLimits,
    Finding,
    capped_by,
    collect,
    option_of,
    worst,
)
from playbooks.engines.kit.checks import ChangeLike, Check, Observed
from playbooks.engines.types import Bottleneck, Measurement, Option, Verdict


class Sized(ChangeLike, Protocol):
    """What the batch-size limits read of a change: the KV capacity now and after."""

    @property
    def current(self) -> int: ...

    @property
    def tokens(self) -> int | None: ...

    @property
    def batch_caps(self) -> tuple[BatchCap, ...]: ...


Srv = TypeVar("Srv")
Srv_co = TypeVar("Srv_co", covariant=True)


class Measured(Protocol[Srv_co]):
    """What `evaluate` reads of an engine's context: the server, and a measurement of it."""

    @property
    def server(self) -> Srv_co: ...

    @property
    def m(self) -> Measurement: ...


C = TypeVar("C", bound=Sized)
Gain = tuple[float, float] | None


def batch_limits(change: Sized, checks: Sequence[Check[Any]], seen: Observed) -> BatchLimits | None:
    """What bounds the batch after the change (`BatchLimits`); None where kvpilot cannot
    predict the gain (the capacity is not predicted, or an argument changes more than the KV
    pool and the caps on the batch)."""
    if change.tokens is None or not all(check.predicts_gain_for(change) for check in checks):
        return None
    m = seen.m
    return BatchLimits(
        m.running, m.queued, change.current, change.tokens, change.batch_caps, pool_room(seen)
    )


def pool_room(seen: Observed) -> float:
    """How many times today's batch today's pool would hold, where a cap on the batch is the
    bottleneck and the pool has room (`FULL_POOL_USAGE` over the window's usage); 1 otherwise.
    Measured on an H100 with SGLang: capped at 40 with the pool 51% used, the uncapped server ran
    72. Both engines call a batch held at its sequence cap `compute`; vLLM admits until its
    blocks run out, so for it the share is a floor and the prediction errs low."""
    usage = seen.m.token_usage
    if seen.bottleneck != "compute" or not usage:
        return 1.0
    return max(1.0, FULL_POOL_USAGE / usage)


@dataclass(frozen=True)
class Verdicts(Generic[Srv, C]):
    """One engine's way to a verdict: `change_of` (a server's facts and the values asked for,
    as the engine's typed change), `checks_for` a change, `gain` (the throughput change a
    change's batch limits buy, None where unpredictable); an option's title leaves out the
    `implied` arguments, and names the GPU memory per GPU a change adds to the static
    allocations where `static_gpu_gib` says."""

    change_of: Callable[[Srv, Mapping[str, Any]], C]
    checks_for: Callable[[C], Sequence[Check[C]]]
    gain: Callable[[C, Observed, BatchLimits | None], Gain]
    implied: frozenset[str] = frozenset()
    static_gpu_gib: Callable[[C], float | None] = lambda change: None

    def option(
        self, change: C, found: list[Finding], verdict: Verdict, gain: Gain, considered: bool
    ) -> Option:
        return option_of(
            change.values, change.tokens, found, verdict, gain, considered, self.implied,
            self.static_gpu_gib(change),
        )  # fmt: skip

    def findings_of(self, change: C, seen: Observed | None) -> list[Finding]:
        return collect(self.checks_for(change), change, seen)

    def evaluate(
        self,
        values: dict[str, Any],
        ctx: Measured[Srv],
        bottleneck: Bottleneck,
        considered: bool = False,
    ) -> Option:
        """Judge one change against a measured server: safe, and does it address the
        bottleneck."""
        change = self.change_of(ctx.server, values)
        seen = Observed(ctx.m, bottleneck)
        limits = batch_limits(change, self.checks_for(change), seen)
        found = self.findings_of(change, seen)
        verdict = worst(found, "not_useful")
        found.append(capped_by(limits, seen.kv_bound, verdict))
        return self.option(change, found, verdict, self.gain(change, seen, limits), considered)

    def judge(self, server: Srv, values: dict[str, Any]) -> Option:
        """The safety verdict for one change, before anything is measured (an experiment's
        check): only the safety halves run, `unsafe` or `needs_opt_in` where a check says so,
        otherwise `possible`, since whether it helps is what the experiment is for."""
        change = self.change_of(server, values)
        found = self.findings_of(change, None)
        verdict = worst(found, "possible")
        if not any(f.verdict is not None for f in found):
            found.append(Finding(reasons=(NOTHING_AGAINST,)))
        return self.option(change, found, verdict, None, True)
