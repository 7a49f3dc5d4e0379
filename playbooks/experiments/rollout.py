"""Fleet rollout (pure): which servers qualify and the next move, from the rollout's rows.

Fleet rollout: a change kept on one server of a group, taken to the group's other servers
with the same model and hardware, a gated experiment at a time (pure decisions).

Which servers (`eligible`): a peer qualifies when kvpilot knows it to be the same as the server
the change was kept on, on every count it can see: the same engine; the same served model (as
the server reports it); the same GPU memory per GPU as configured (`gpu_memory_gib`, kvpilot's
knowledge of the GPU type); the same KV capacity before the change within 2% (the GPU count and
memory, the model and the memory settings together decide it, so a peer on other GPUs or a
different parallel layout shows it); and the same values of the changed arguments as the source
had before the change (so the change means the same move). A peer that cannot restart (no
launcher), that is busy with an experiment, or that cannot be read, is left out with the reason.

What next (`next_move`), from the rollout's rows: start the next servers (at most `batch` at
once, the group's `max_concurrent_restarts`); on the first step not kept, stop the steps still
running (they revert themselves), then revert, one at a time and newest first, every server this
rollout changed; then end, saying why. A server found running the change already when its
turn comes is skipped (nothing to restart, nothing to revert), not a step that failed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from storage.experiments import TERMINAL, State

CAPACITY_TOLERANCE = 0.02


@dataclass(frozen=True)
class Candidate:
    """A server as kvpilot knows it, for "the same model and hardware"."""

    name: str
    engine: str
    model: str | None = None
    gpu_memory_gib: float | None = None
    capacity_tokens: int | None = None
    values: Mapping[str, Any] = field(default_factory=dict)  # the changed arguments' values
    restartable: bool = True
    busy: str | None = None  # why it cannot take an experiment now
    error: str | None = None  # why it could not be read
    unchanged: str | None = None  # why the change would change nothing there (no_change)


def eligible(source: Candidate, peer: Candidate, target: Mapping[str, Any]) -> str | None:
    """None when `peer` qualifies for the change kept on `source` (whose `values` are those
    before the change, and `target` those after); else why not, for people."""
    if peer.error is not None:
        return f"could not be read: {peer.error}"
    if not peer.restartable:
        return "kvpilot cannot restart it (no launcher configured)"
    if peer.busy is not None:
        return peer.busy
    if peer.engine != source.engine:
        return f"runs {peer.engine}, not {source.engine}"
    if peer.unchanged is not None:  # (before its capacity, which the change itself moves)
        return f"runs the change already: {peer.unchanged}"
    return _other_hardware(source, peer) or _other_values(source, peer, target)


def _other_hardware(source: Candidate, peer: Candidate) -> str | None:
    """Why `peer` is not the same model on the same hardware as `source`, if it is not."""
    if peer.model != source.model:
        return f"serves {peer.model}, not {source.model}"
    if peer.gpu_memory_gib != source.gpu_memory_gib:
        return f"GPU memory {_gib(peer.gpu_memory_gib)} per GPU, not {_gib(source.gpu_memory_gib)}"
    if (
        peer.capacity_tokens is None
        or source.capacity_tokens is None
        or abs(peer.capacity_tokens - source.capacity_tokens)
        > CAPACITY_TOLERANCE * source.capacity_tokens
    ):
        return (
            f"KV capacity {_tokens(peer.capacity_tokens)} tokens, not "
            f"{_tokens(source.capacity_tokens)} (other GPUs, parallel layout or memory settings)"
        )
    return None


def _other_values(source: Candidate, peer: Candidate, target: Mapping[str, Any]) -> str | None:
    """Why the change would not be the same move on `peer`, if it would not."""
    if dict(peer.values) == dict(target):
        return "runs the change already"
    if dict(peer.values) != dict(source.values):
        shown = ", ".join(f"{k}={v}" for k, v in peer.values.items())
        return f"runs {shown or 'other values'}, not what the change was measured from"
    return None


def _gib(value: float | None) -> str:
    return "unknown" if value is None else f"{value:g} GiB"


def _tokens(value: int | None) -> str:
    return "unknown" if value is None else f"{value:,}"


# ---------------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class ServerPlan:
    server: str
    from_args: tuple[str, ...]
    to_args: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    """What one approval allows: exactly these servers, this change, these arguments."""

    group: str
    source_experiment_id: int
    source_server: str
    change: Mapping[str, Any]
    servers: tuple[ServerPlan, ...]
    batch: int
    gate: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "source_experiment_id": self.source_experiment_id,
            "source_server": self.source_server,
            "change": dict(self.change),
            "servers": [
                {"server": s.server, "from_args": list(s.from_args), "to_args": list(s.to_args)}
                for s in self.servers
            ],
            "batch": self.batch,
            "gate": dict(self.gate),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Plan:
        return cls(
            group=str(data["group"]),
            source_experiment_id=int(data["source_experiment_id"]),
            source_server=str(data["source_server"]),
            change=dict(data["change"]),
            servers=tuple(
                ServerPlan(str(s["server"]), tuple(s["from_args"]), tuple(s["to_args"]))
                for s in data["servers"]
            ),
            batch=int(data["batch"]),
            gate=dict(data["gate"]),
        )

    def server(self, name: str) -> ServerPlan:
        return next(s for s in self.servers if s.server == name)


# ---------------------------------------------------------------------------------- next move
@dataclass(frozen=True)
class Step:
    """One row of the rollout as the decision reads it."""

    server: str
    kind: Literal["apply", "revert"]
    # apply: started | aborted | not_started | skipped (it already ran the change);
    # revert: reverting | reverted | failed | left
    status: str
    experiment_id: int | None = None
    state: State | None = None  # the apply step's experiment's state
    cause: str | None = None  # why it ended, as its last move recorded

    @property
    def held(self) -> bool:
        """It ended before any restart because a freeze or the change window held it (or its
        approval ran out while it waited): the servers already changed are not at fault."""
        return self.cause in HELD_CAUSES

    @property
    def skipped(self) -> bool:
        """The server already ran the change: nothing was restarted, nothing is owed."""
        return self.status == "skipped"

    @property
    def ended(self) -> bool:
        return self.state is not None and self.state in TERMINAL

    @property
    def kept(self) -> bool:
        return self.state == State.kept


HELD_CAUSES = frozenset({"held", "expired_waiting"})


@dataclass(frozen=True)
class Start:
    servers: tuple[str, ...]


@dataclass(frozen=True)
class Wait:
    reason: str


@dataclass(frozen=True)
class Abort:
    experiment_ids: tuple[int, ...]
    reason: str


@dataclass(frozen=True)
class Revert:
    server: str


@dataclass(frozen=True)
class Finish:
    outcome: Literal["done", "reverted", "failed", "stopped"]
    reason: str


RolloutMove = Start | Wait | Abort | Revert | Finish
REVERT_DONE = frozenset({"reverted", "failed", "left"})


def next_move(servers: Sequence[str], batch: int, rows: Sequence[Step]) -> RolloutMove:
    """The rollout's next move from its rows (module docstring)."""
    applies = {s.server: s for s in rows if s.kind == "apply"}
    reverts = {s.server: s for s in rows if s.kind == "revert"}
    failed = [
        applies[s] for s in servers if s in applies and applies[s].ended and not applies[s].kept
    ]
    running = [a for a in applies.values() if not a.ended and not a.skipped]
    if not failed:
        pending = [s for s in servers if s not in applies]
        if not pending and not running:
            return Finish("done", _done(servers, applies))
        room = batch - len(running)
        if pending and room > 0:
            return Start(tuple(pending[:room]))
        return Wait(f"{', '.join(a.server for a in running)} measuring the change")
    first = next((f for f in failed if not f.held), failed[0])  # a real failure rules
    if first.held:
        # A freeze or a change window stopped it: the servers already changed keep the change
        # (reverting them would be restarts in the very hours restarts are held).
        held = [a for a in running if a.status != "aborted" and a.experiment_id]
        if held:
            return Wait(f"{', '.join(a.server for a in held)} measuring before the rollout stops")
        kept = [s for s in servers if s in applies and applies[s].kept]
        return Finish(
            "stopped",
            f"{first.server} could not restart now ({first.cause}): the rollout stops, "
            f"{', '.join(kept) or 'no server'} keeping the change; roll out again once the "
            "hold lifts",
        )
    why = f"{first.server} ended {first.state}: the rollout stops"
    to_stop = tuple(a.experiment_id for a in running if a.status != "aborted" and a.experiment_id)
    if to_stop:
        return Abort(to_stop, why)
    if running:
        return Wait(f"{', '.join(a.server for a in running)} reverting after the stop")
    changed = [s for s in servers if s in applies and applies[s].kept]
    for server in reversed(changed):  # newest first
        revert = reverts.get(server)
        if revert is None or revert.status not in REVERT_DONE:
            return Revert(server)
    return _finished(why, changed, {s: reverts[s].status for s in changed})


def _done(servers: Sequence[str], applies: Mapping[str, Step]) -> str:
    skipped = [s for s in servers if applies[s].skipped]
    if not skipped:
        return f"kept on all {len(servers)} server(s)"
    if len(skipped) == len(servers):
        return f"nothing to do: {', '.join(skipped)} already ran it"
    return f"kept on {len(servers) - len(skipped)} server(s); {', '.join(skipped)} already ran it"


def _finished(why: str, changed: list[str], reverts: Mapping[str, str]) -> Finish:
    """How a stopped rollout ended, once every server it changed was reverted (or not)."""
    bad = [s for s in changed if reverts[s] == "failed"]
    if bad:
        return Finish("failed", f"{why}; the revert of {', '.join(bad)} failed: a person must act")
    left = [s for s in changed if reverts[s] == "left"]
    done = [s for s in changed if reverts[s] == "reverted"]
    tail = f"; reverted {', '.join(done)}" if done else ""
    if not changed:
        tail = "; no server had been changed"
    if left:
        tail += f"; left {', '.join(left)} as a person set it"
    return Finish("reverted", why + tail)
