"""The experiment's steps behind a router: out of rotation, drained, and back in once ready.

`steps` decides (`Leave`, `Drain`, `Rejoin`, and `Issue` once drained); this module gathers what
those decisions read (`facts`) and takes the steps, recording every router call in the audit log
and what it learnt in the experiment's progress, so a bot killed anywhere continues: removing or
adding twice is harmless (the routers' calls are idempotent, and `storage.rotation` records a
server out once). Without `Deps.rotation` nothing here runs and restarts are as before.

It also keeps a peer's time out of rotation from reading as drift: while a peer is out, its load
goes to this server, so those samples are left out of the gate's windows (`gate_windows`) and no
stored window across such a time becomes a baseline (`known_baseline_bounds`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from playbooks.engines.base import EngineError, Snapshot
from playbooks.experiments import steps
from playbooks.experiments.deps import Deps
from playbooks.experiments.progress import Progress, progress_of
from playbooks.routers import drain
from playbooks.routers.base import RouterError
from storage import experiments as store
from storage import rotation as rotation_store
from storage.experiments import State

RESTARTS = frozenset({State.restarting, State.reverting})

Save = Callable[..., None]  # advance's `_progress` for this row: stores what a step learnt


def facts(deps: Deps, state: State, progress: Progress) -> steps.RotationFacts | None:
    """What the drain decides on: whether kvpilot has the server out (storage), and while it
    drains (out, not yet issued) whether the router still routes to it and what runs on it."""
    rot = deps.rotation
    if rot is None or state not in RESTARTS:
        return None
    out = rotation_store.open_for(deps.db, deps.server) is not None
    listed: bool | None = None
    running: float | None = None
    if progress.out_at is not None and progress.issued is None:
        listed = rot.listed()
        running = running_now(deps)
    return steps.RotationFacts(
        out=out, listed=listed, running=running, drain_timeout_s=rot.drain_timeout_s
    )


def running_now(deps: Deps) -> float | None:
    """Requests on the server now, running or queued in its scheduler (a queued request is
    dropped by a restart as surely as a running one), from the engine's load report: the
    metrics gauges are refreshed only while the scheduler steps, so an idle server keeps showing
    its last batch (seen on the twin, which follows SGLang). The metrics' reading where there
    is no load report; None when the server does not answer (nothing kvpilot can drain)."""
    for read in (deps.client.load_snapshot, deps.client.snapshot):
        try:
            snap = read()
            return snap.running + snap.queued
        except EngineError:
            continue
    return None


def take(
    deps: Deps,
    row: store.ExperimentRow,
    facts_: steps.Facts,
    step: steps.RotationStep,
    *,
    progress: Save,
    take_slot: Callable[[], bool],
) -> None:
    if isinstance(step, steps.Leave):
        leave(deps, row, facts_, progress=progress, take_slot=take_slot)
    elif isinstance(step, steps.Drain):
        if step.quiet:
            progress(quiet_at=facts_.now_ts)
        elif progress_of(row).quiet_at is not None:
            progress(quiet_at=None)  # something came in after all: look for quiet again
        running = "unknown" if step.running is None else f"{step.running:.0f}"
        routed = " (the router still routes to it)" if step.listed else ""
        deps.say(f"{row.state}: draining, {running} request(s) in flight{routed}")
    else:
        rejoin(deps, row, facts_, progress=progress)


def leave(
    deps: Deps,
    row: store.ExperimentRow,
    facts_: steps.Facts,
    *,
    progress: Save,
    take_slot: Callable[[], bool],
) -> None:
    """The restart slot first (a server out of rotation is down for the group), then the
    record, then the router; a router that cannot be asked is recorded and asked again."""
    rot = deps.rotation
    assert rot is not None
    if not take_slot():
        return
    now = deps.now()
    try:
        known = rotation_store.open_for(deps.db, deps.server)
        entry = known.entry if known is not None else rot.router.entry(rot.worker)
        rotation_store.take_out(
            deps.db, server=deps.server, group=rot.group, worker=rot.worker,
            router=rot.describe(), experiment_id=row.id, entry=entry, now=now,
        )  # fmt: skip
        done = rot.router.remove(rot.worker)
    except RouterError as exc:
        if progress_of(row).leave_tried_at is None:
            drain.record(
                deps.db, deps.server, row.id, now,
                f"router: could not take {deps.server} out of rotation: {exc}; asking again "
                f"for up to {rot.drain_timeout_s:g} s, then restarting without a drain",
            )  # fmt: skip
            progress(leave_tried_at=facts_.now_ts)
        deps.say(f"{row.state}: {exc}")
        return
    drain.record(deps.db, deps.server, row.id, now, f"router: {done} ({rot.describe()})")
    deps.say(f"{row.state}: out of rotation ({done}); draining its running requests")
    progress(out_at=facts_.now_ts)


def before_issue(deps: Deps, row: store.ExperimentRow, facts_: steps.Facts) -> None:
    """Say and record how the drain ended, once, as the restart is issued."""
    rot, r = deps.rotation, facts_.rotation
    if rot is None or r is None or progress_of(row).issued is not None:
        return
    out_at = progress_of(row).out_at
    if out_at is None:
        text = (
            f"router: restarting {deps.server} without a drain: {rot.describe()} could not be "
            f"asked for {rot.drain_timeout_s:g} s; its running requests are dropped"
        )
    else:
        waited = facts_.now_ts - float(out_at)
        if r.running and r.running > 0:
            text = (
                f"router: drain timeout after {waited:.0f} s: {r.running:.0f} request(s) still "
                f"running on {deps.server} are dropped by the restart"
            )
        else:
            text = f"router: {deps.server} drained in {waited:.0f} s (nothing running)"
    drain.record(deps.db, deps.server, row.id, deps.now(), text)
    deps.say(f"{row.state}: {text.removeprefix('router: ')}")


def rejoin(deps: Deps, row: store.ExperimentRow, facts_: steps.Facts, *, progress: Save) -> bool:
    """Ask the router to put the server back; True once it is back (or kvpilot gave up
    waiting, bounded by `rejoin_timeout_s`, and said so)."""
    rot = deps.rotation
    if rot is None:
        return True
    asked = progress_of(row).rejoin_asked_at
    ask = asked is None or facts_.now_ts - float(asked) >= drain.ASK_AGAIN_S
    if drain.put_back(deps.db, rot, deps.server, row.id, deps.now(), ask=ask):
        deps.say(f"{row.state}: back in the rotation of {rot.describe()}")
        return True
    since = progress_of(row).rejoin_since
    since = facts_.now_ts if since is None else since
    if ask:
        progress(rejoin_since=since, rejoin_asked_at=facts_.now_ts)
    answer = drain.rejoin_state(
        listed=False, since=float(since), now=facts_.now_ts, timeout_s=rot.rejoin_timeout_s
    )
    if answer == "give_up":
        deps.say(f"{row.state}: {drain.give_up(deps.db, rot, deps.server, row.id, deps.now())}")
        return True
    deps.say(f"{row.state}: waiting for {rot.describe()} to list it again")
    return False


def on_end(deps: Deps, row: store.ExperimentRow, to: State) -> None:
    """An experiment ending with its server out of rotation (a restart refused before it
    changed anything, a person's change found, a revert that failed): put back what kvpilot
    took out, once, unless the server is on no known-good configuration."""
    rot = deps.rotation
    if rot is None or rotation_store.open_for(deps.db, deps.server) is None:
        return
    if to == State.failed:
        drain.record(
            deps.db, deps.server, row.id, deps.now(),
            f"router: {deps.server} stays out of the rotation of {rot.describe()}: it runs no "
            "known-good configuration; put it back by hand once it serves again",
        )  # fmt: skip
        return
    if not drain.put_back(deps.db, rot, deps.server, row.id, deps.now()):
        drain.record(
            deps.db, deps.server, row.id, deps.now(),
            f"router: asked {rot.describe()} to put {deps.server} back; check that it lists "
            f"{rot.worker} again",
        )  # fmt: skip


def gate_windows(
    deps: Deps, baseline: Sequence[Snapshot], trial: Sequence[Snapshot], settle_s: float
) -> tuple[list[Snapshot], list[Snapshot]]:
    """The gate's windows without the samples taken while a peer was out of rotation."""
    rot = deps.rotation
    if rot is None or not (baseline or trial):
        return list(baseline), list(trial)
    first = min(s.t for s in (*baseline, *trial))
    since = datetime.fromtimestamp(first, UTC)
    spans = [
        (p.out_at.timestamp(), None if p.back_at is None else p.back_at.timestamp())
        for p in rotation_store.peer_spans(deps.db, rot.group, deps.server, since)
    ]
    if not spans:
        return list(baseline), list(trial)
    return (
        drain.in_full_rotation(baseline, spans, settle_s),
        drain.in_full_rotation(trial, spans, settle_s),
    )


def known_baseline_bounds(deps: Deps, since_ts: float) -> tuple[str | None, float | None]:
    """For a stored baseline: why none may be used now (a peer is out of rotation), or the
    latest moment a peer left or rejoined it (the window must start after it)."""
    rot = deps.rotation
    if rot is None:
        return None, None
    out = rotation_store.peers_out(deps.db, rot.group, deps.server)
    if out:
        names = ", ".join(p.server for p in out)
        return f"{names} out of the router's rotation now: its load runs here", None
    since = datetime.fromtimestamp(since_ts, UTC)
    moments = [
        max(p.out_at, p.back_at or p.out_at).timestamp()
        for p in rotation_store.peer_spans(deps.db, rot.group, deps.server, since)
    ]
    return None, max(moments) if moments else None
