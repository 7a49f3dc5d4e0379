"""Fleet rollout in chat: the verdict's "Roll out" button, its approval, rollouts carried.

Fleet rollout in chat: the "Roll out to N servers" button on a kept group experiment's
verdict, its click (approved as a proposal is: `bot.chat.auth`), and carrying approved rollouts
in this process, their progress in the verdict's thread.

Which servers qualify and what the rollout does next are `playbooks.experiments.rollout`'s
(pure); carrying it a bounded step at a time is `rollout_run`'s. This module reads what those
need from configuration and the servers (`offer`), and gives the rollout what a front end gives
an experiment: a thread, a surface, the runner that carries its steps.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from sqlite_utils import Database

from bot.app.config import Config, ConfigError
from bot.app.wiring import engine as engine_of
from bot.app.wiring import engine_client, experiment_deps, launcher
from bot.chat.messages import Button, Confirm, Message, SmallPrint
from bot.chat.render import change_text, mention
from bot.chat.views import ROLLOUT
from playbooks.clock import Clock
from playbooks.engines import restore_snapshot
from playbooks.engines.base import Engine, EngineError
from playbooks.experiments import no_change
from playbooks.experiments.machine import Deps
from playbooks.experiments.ownership import this_process
from playbooks.experiments.rollout import Candidate, Plan, ServerPlan, eligible
from playbooks.experiments.rollout_run import RolloutContext, advance_rollout
from playbooks.launchers.base import LaunchError
from storage import audit, chat
from storage import experiments as store
from storage import rollouts as rollout_store
from storage import samples as sample_store
from storage.chat import MessageRef
from storage.db import open_db
from storage.errors import NotFound
from storage.experiments import State
from storage.proposals import plan_hash

if TYPE_CHECKING:
    from bot.chat.auth import Action, Principal
    from bot.chat.surface import Surface

log = logging.getLogger(__name__)


class Carrier(Protocol):
    """What rollouts need of the experiment runner (`bot.chat.runner.ExperimentRunner`, which
    offers and resumes rollouts through this module, so it is named here by what it provides)."""

    config: Config
    clock: Clock
    db: Callable[[], Database]
    surface_for: Callable[[str], Surface]
    now: Callable[[], datetime]
    stopping: threading.Event
    refusal: Callable[[str, str], str | None]  # why this bot may not change a server now

    def start(self, exp_id: int, *, thread: MessageRef | None, resume: bool = False) -> None: ...

    def verdict_message(self, row: store.ExperimentRow) -> Message: ...

    def _default_channel(self) -> str | None: ...


# ---------------------------------------------------------------------------------- the offer
@dataclass
class Offer:
    """The rollout a kept experiment offers: its plan (None: nothing to roll out), the servers
    left out and why, or why there is no offer at all."""

    plan: Plan | None
    left_out: list[tuple[str, str]] = field(default_factory=list)
    reason: str = ""

    @property
    def hash(self) -> str:
        return "" if self.plan is None else plan_hash(self.plan.to_json())


def offer(config: Config, db: Database, row: store.ExperimentRow, clock: Clock) -> Offer:
    """What rolling out the change kept by `row` to its group would be (reads each server)."""
    if row.state != State.kept:
        return Offer(None, reason=f"experiment {row.id} ended {row.state}, not kept")
    if rollout_store.rollout_of_step(db, row.id) is not None:
        return Offer(None, reason=f"experiment {row.id} is a step of a rollout")
    cfg = config.servers.get(row.server)
    if cfg is None or cfg.group is None:
        return Offer(None, reason=f"{row.server} is in no group ([servers.{row.server}] group)")
    group, members = config.group_servers(cfg.group)
    engine = engine_of(cfg)
    base = [str(a) for a in row.baseline_config.get("args", [])]
    trial = [str(a) for a in row.trial_config.get("args", [])]
    source = replace(
        _candidate(config, db, row.server, clock, row.change),
        values=_values(engine, base, row.change),
        capacity_tokens=_capacity_before(db, row.id),
        busy=None,
        unchanged=None,  # it runs the change: it was kept there
    )
    target = _values(engine, trial, row.change)
    plans, left = [], []
    for peer in members:
        if peer.name == row.server:
            continue
        found = _candidate(config, db, peer.name, clock, row.change)
        why = eligible(source, found, target)
        if why is not None:
            left.append((peer.name, why))
            continue
        args = launcher(config, peer, clock).current_args()
        to = engine.with_change(args, dict(row.change))
        plans.append(ServerPlan(peer.name, tuple(args), tuple(to)))
    if not plans:
        return Offer(None, left, "no other server of the group qualifies")
    plan = Plan(
        group.name, row.id, row.server, dict(row.change), tuple(plans),
        group.max_concurrent_restarts, dict(vars(cfg.gate)),
    )  # fmt: skip
    return Offer(plan, left)


def _capacity_before(db: Database, exp_id: int) -> int | None:
    """The source's KV capacity before the change, from its baseline's samples."""
    for sample in sample_store.samples_for(db, exp_id, "baseline"):
        capacity = restore_snapshot(sample.metrics, float(sample.t)).capacity_tokens
        if capacity:
            return capacity
    return None


def _candidate(
    config: Config, db: Database, name: str, clock: Clock, change: dict[str, Any]
) -> Candidate:
    cfg = config.server(name)
    base = Candidate(name, engine_of(cfg).name, gpu_memory_gib=cfg.gpu_memory_gib)
    if cfg.launcher is None:
        return replace(base, restartable=False)
    active = [e for e in store.active_experiments(db) if e.server == name]
    busy = f"busy with experiment {active[0].id} ({active[0].state})" if active else None
    client = engine_client(cfg, timeout_s=5.0)
    try:
        settings = client.settings()
        found = launcher(config, cfg, clock)
        args = found.current_args()
    except (EngineError, LaunchError, ConfigError) as exc:
        return replace(base, error=str(exc))
    finally:
        client.close()
    where = no_change.launcher_words(found.kind)
    unchanged = no_change.unchanged_by(client.engine, name, args, where)(change)
    return replace(
        base, model=settings.model, capacity_tokens=settings.capacity_tokens,
        values=_values(client.engine, args, change), busy=busy, unchanged=unchanged,
    )  # fmt: skip


def _values(engine: Engine, args: list[str], change: dict[str, Any]) -> dict[str, Any]:
    """The changed arguments as the engine would run them from `args` (`0.880` is 0.88, an
    absent flag its constant default); one it works out at start-up as given (None: absent)."""
    readings = {key: engine.read_arg(args, key) for key in change}
    return {key: r.value if r.known else (r.spelt or None) for key, r in readings.items()}


def with_rollout_offer(runner: Carrier, row: store.ExperimentRow, message: Message) -> Message:
    """The verdict of a kept group experiment, with its "Roll out to N servers" button."""
    try:
        found = offer(runner.config, runner.db(), row, runner.clock)
    except (ConfigError, EngineError, LaunchError) as exc:
        log.info("experiment %s: no rollout offered: %s", row.id, exc)
        return message
    if found.plan is None:
        return message
    servers = [s.server for s in found.plan.servers]
    lines = [
        f"Roll out {change_text(row.change)} to {', '.join(servers)} (group {found.plan.group}): "
        f"{found.plan.batch} at a time, each measured by the gate; the first not kept stops "
        "the rollout and reverts the servers it changed."
    ]
    lines += [f"Left out: {name}: {why}" for name, why in found.left_out]
    button = Button(
        ROLLOUT, f"{row.id}:{found.hash[:16]}",
        f"Roll out to {len(servers)} server{'s' if len(servers) != 1 else ''}", "primary",
        Confirm(
            "Roll out this change?",
            f"{change_text(row.change)} on {', '.join(servers)}, one experiment each "
            f"({found.plan.batch} at a time), stopping and reverting at the first not kept.",
            "Roll out",
        ),
    )  # fmt: skip
    return replace(
        message,
        text=message.text + "\n" + "\n".join(lines),
        parts=(*message.parts, SmallPrint(tuple(lines))),
        buttons=(*message.buttons, button),
    )


# ---------------------------------------------------------------------------------- the click
class Host(Protocol):
    """What the click needs of `bot.chat.flow.Kvpilot`."""

    config: Config
    clock: Clock

    @property
    def runner(self) -> Carrier: ...

    def db(self) -> Database: ...

    def _check(
        self, who: Principal, action: Action, *, proposer: str | None = None, **where: Any
    ) -> str | None: ...

    def deny(self, who: Principal, action: str, reason: str, **where: Any) -> None: ...


def roll_out(
    host: Host, who: Principal, surface: Surface, exp_id: int, hash16: str,
    where: MessageRef | None,
) -> int | None:  # fmt: skip
    """Approve the offered rollout (who may approve a proposal may approve it; four-eyes: not
    the person who proposed the change) and start it; the rollout's id, or None if refused."""
    db = host.db()
    try:
        row = store.get_experiment(db, exp_id)
    except NotFound:
        host.deny(who, "approve", f"no experiment {exp_id} to roll out")
        surface.whisper(who, Message.note(f":warning: There is no experiment {exp_id}."))
        return None
    proposer = None
    if row.proposal_id is not None:
        from storage.proposals import get_proposal  # noqa: PLC0415 - only with a proposal

        proposer = get_proposal(db, row.proposal_id).created_by
    refused = host._check(
        who, "approve", proposer=proposer, server=row.server, experiment_id=exp_id
    )
    if refused is not None:
        surface.whisper(who, Message.note(f":no_entry: Not rolled out: {refused}."))
        return None
    found = offer(host.config, db, row, host.clock)
    lost = [
        why
        for s in (found.plan.servers if found.plan is not None else ())
        if (why := host.runner.refusal(s.server, "roll out a change")) is not None
    ]
    if lost:  # another bot claims one of the group's servers now
        surface.whisper(who, Message.note(f":no_entry: Not rolled out: {lost[0]}."))
        return None
    if found.plan is None or found.hash[:16] != hash16:
        why = found.reason or "the group's servers or their arguments changed since the offer"
        host.deny(who, "approve", f"rollout of experiment {exp_id} refused: {why}",
                  server=row.server, experiment_id=exp_id)  # fmt: skip
        surface.whisper(who, Message.note(f":no_entry: Not rolled out: {why}."))
        return None
    try:
        rollout = rollout_store.start_rollout(
            db, group=found.plan.group, source_experiment_id=exp_id,
            plan=found.plan.to_json(), approved_by=who.user, now=host.clock.utcnow(),
        )  # fmt: skip
    except rollout_store.RolloutOpen as exc:
        surface.whisper(who, Message.note(f":no_entry: Not rolled out: {exc}."))
        return None
    servers = ", ".join(s.server for s in found.plan.servers)
    audit.record(db, audit.Note(
        actor=who.user, created=host.clock.utcnow(), server=row.server, experiment_id=exp_id,
        text=f"rollout {rollout.id} approved by {who.user}: {change_text(row.change)} on "
        f"{servers} (plan {rollout.plan_hash[:12]})",
    ))  # fmt: skip
    if where is not None:
        verdict = host.runner.verdict_message(row).without_buttons(
            f":rocket: Rollout {rollout.id} to {servers} approved by {mention(who.user)}; "
            "progress below."
        )
        surface.update(where, verdict)
    # its progress goes where the verdict is: the kept experiment's thread
    thread = chat.find_message(db, "experiment", exp_id, "verdict") or where
    drivers(host.runner).start(rollout.id, thread)
    return rollout.id


# ---------------------------------------------------------------------------------- carrying
_DRIVERS: weakref.WeakKeyDictionary[Any, RolloutDriver] = weakref.WeakKeyDictionary()


def drivers(runner: Carrier) -> RolloutDriver:
    """This process's rollout driver, one per runner."""
    found = _DRIVERS.get(runner)
    if found is None:
        found = _DRIVERS[runner] = RolloutDriver(runner)
    return found


def resume_rollouts(runner: Carrier) -> list[int]:
    """After a bot restart: carry on every open rollout no other living process carries."""
    return drivers(runner).resume()


class RolloutDriver:
    """Carries rollouts in this process, one thread each (a step is short; between them it
    sleeps on the process's clock); their steps' experiments go to the runner."""

    def __init__(self, runner: Carrier) -> None:
        self.runner = runner
        self._threads: dict[int, threading.Thread] = {}
        self._lock = threading.Lock()

    def start(self, rollout_id: int, thread: MessageRef | None) -> None:
        with self._lock:
            if self.runner.stopping.is_set() or (
                rollout_id in self._threads and self._threads[rollout_id].is_alive()
            ):
                return
            worker = threading.Thread(
                target=self._run, args=(rollout_id, thread), name=f"rollout-{rollout_id}",
                daemon=True,
            )  # fmt: skip
            self._threads[rollout_id] = worker
        worker.start()

    def resume(self) -> list[int]:
        db = self.runner.db()
        resumed = []
        for row in rollout_store.open_rollouts(db):
            thread = chat.find_message(db, "experiment", row.source_experiment_id, "verdict")
            self.start(row.id, thread)
            resumed.append(row.id)
        return resumed

    def join(self, rollout_id: int, timeout: float | None = None) -> None:
        with self._lock:
            worker = self._threads.get(rollout_id)
        if worker is not None:
            worker.join(timeout)

    def _run(self, rollout_id: int, thread: MessageRef | None) -> None:
        runner = self.runner
        db = open_db(runner.config.database, any_thread=True)
        surface = None
        channel = thread.channel if thread else runner._default_channel()
        if channel:
            surface = runner.surface_for(channel)
        progress = _Progress(db, surface, thread, rollout_id, runner)
        ctx = RolloutContext(
            db=db,
            deps_for=lambda server: self._deps(db, server),
            carry=lambda step: self._carry(db, step, thread),
            say=progress.say,
            now=runner.clock.utcnow,
            wall_now=runner.now,
            owner=str(this_process()),
        )
        failures = 0
        while not runner.stopping.is_set():
            try:
                delay = advance_rollout(ctx, rollout_id)
                failures = 0
            except Exception:  # the rollout is persisted: try again, then leave it for a restart
                log.exception("rollout %s: a step failed", rollout_id)
                failures += 1
                if failures >= 20:
                    return
                delay = 15.0
            if delay is None:
                return
            runner.stopping.wait(runner.clock.wall_seconds(delay))

    def _deps(self, db: Database, server: str) -> Deps:
        """A step's dependencies on `server`; refused (the rollout stays where it stands) once
        another bot claims that server."""
        why = self.runner.refusal(server, "roll out a change")
        if why is not None:
            raise ConfigError(why)
        return experiment_deps(self.runner.config, server, db, clock=self.runner.clock)

    def _carry(self, db: Database, step: rollout_store.StepRow, thread: MessageRef | None) -> None:
        assert step.experiment_id is not None
        # the step's experiment reports where the rollout does, also after a bot restart
        pid = step.proposal_id
        if (
            thread is not None
            and pid is not None
            and chat.find_message(db, "proposal", pid, "approval") is None
        ):
            chat.remember_message(db, "proposal", pid, "approval", thread, now=self.runner.now())
        self.runner.start(step.experiment_id, thread=thread)


@dataclass
class _Progress:
    """One message in the thread, edited with the rollout's latest news."""

    db: Database
    surface: Surface | None
    thread: MessageRef | None
    rollout_id: int
    runner: Carrier
    lines: list[str] = field(default_factory=list)

    def say(self, text: str) -> None:
        log.info("%s", text)
        if self.surface is None:
            return
        self.lines = [*self.lines, text][-12:]
        message = Message.note(
            f"*Rollout {self.rollout_id}*\n" + "\n".join(f"• {t}" for t in self.lines)
        )
        row = rollout_store.get_rollout(self.db, self.rollout_id)
        role = f"rollout-{self.rollout_id}"
        ref = chat.find_message(self.db, "experiment", row.source_experiment_id, role)
        try:
            if ref is None:
                ref = self.surface.post(message, thread=self.thread)
                chat.remember_message(self.db, "experiment", row.source_experiment_id, role, ref,
                                      now=self.runner.now())  # fmt: skip
            else:
                self.surface.progress(ref, message)
        except Exception:  # a chat hiccup must not stop the rollout
            log.exception("rollout %s: progress update failed", self.rollout_id)
