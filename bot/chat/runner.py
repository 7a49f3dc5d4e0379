"""Runs approved experiments in the background and reports on them in their thread.

Every experiment this process carries (at most one per server, which storage enforces) is
advanced by the process's one scheduler (`bot.app.ticker`), a bounded step at a time, while
this process holds the experiment's lease, so another kvpilot process never carries it at the
same time; one that another living process holds is left to that process. Progress goes
into one message that is edited in place, at most every `progress_every_s` and on every state
change, so the channel is not flooded; the verdict follows as a reply with a before/after
chart. Where that message is, is stored, so a restarted bot carries on editing it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlite_utils import Database

from bot.app.config import ConfigError
from bot.app.ticker import Stopped, Ticker
from bot.app.wiring import Posting, experiment_deps
from bot.chat.held import held_facts
from bot.chat.messages import Message
from bot.chat.render import change_text
from bot.chat.rollout import resume_rollouts, with_rollout_offer
from bot.reports.charts import verdict_chart
from playbooks.experiments import machine
from playbooks.experiments.outcome import ending
from playbooks.experiments.ownership import ActingRefused, Lease, OwnershipLost
from playbooks.experiments.plans import plan_from_json
from playbooks.experiments.progress import progress_of
from storage import audit, chat
from storage import experiments as store
from storage import samples as sample_store
from storage.chat import MessageRef
from storage.db import open_db
from storage.experiments import TERMINAL, State

if TYPE_CHECKING:
    from bot.chat.surface import Surface
    from storage.proposals import ProposalRow

log = logging.getLogger(__name__)

# How long after its end an experiment's verdict is still posted when it could not be at once
OWED_FOR = timedelta(hours=6)


def no_refusal(_server: str, _doing: str) -> str | None:
    return None


def paused_text(exp_id: int, state: str, why: str) -> str:
    """What a person reads where an experiment's server was lost to another bot: the
    experiment stays recorded where it stands, and no bot advances or reverts it by itself."""
    return f":double_vertical_bar: Experiment {exp_id} is paused where it stands ({state}): {why}."


def stopped_text(exp_id: int, error: BaseException) -> str:
    """What a person reads where an experiment this process carried stopped on an error: its
    state stays recorded, so it can be reverted now or is resumed at kvpilot's next start."""
    return (
        f"⚠️ Experiment {exp_id} stopped on an error: {error}. Its state is recorded: the "
        f"server may still run the change. `/kvpilot abort {exp_id}` reverts it to the "
        "last-known-good configuration; otherwise kvpilot resumes it when it next starts."
    )


class ExperimentRunner:
    def __init__(
        self,
        posting: Posting,
        *,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        progress_every_s: float = 10.0,
    ) -> None:
        self.config = posting.config
        self.db = posting.db
        self.surface_for = posting.surface_for
        self.clock = posting.clock
        self.now = now
        self.progress_every_s = progress_every_s
        self._ticker: Ticker | None = None
        self._lock = threading.Lock()
        # Set on shutdown: no new experiments start, and running ones stop at their next check.
        self.stopping = threading.Event()
        # What follows a verdict in its thread (the campaign's next step: bot/chat/campaign.py)
        self.after_verdict: Callable[[store.ExperimentRow, Surface, MessageRef], None] | None = None
        # Told of every experiment that ended while this process carried it (alerts)
        self.on_end: Callable[[store.ExperimentRow], None] | None = None
        # Why this bot may not change a server (server, doing) -> reason, None when it may: a
        # server whose claim another bot took (`bot.app.claims.ClaimKeeper.refusal`)
        self.refusal: Callable[[str, str], str | None] = no_refusal

    @property
    def ticker(self) -> Ticker:
        """The scheduler, started at first use; never once the runner stops (an experiment
        still being started then would run on a second scheduler nothing stops)."""
        with self._lock:
            if self._ticker is None:
                if self.stopping.is_set():
                    raise Stopped("the runner has stopped: no scheduler is started")
                self._ticker = Ticker(self.clock)
            return self._ticker

    def _started_ticker(self) -> Ticker | None:
        """The scheduler if one was started; unlike `ticker`, never starts one."""
        with self._lock:
            return self._ticker

    def connect(self) -> Database:
        """A connection of its own, for a lease (which may outlive a thread's connection)."""
        return open_db(self.config.database)

    def lease(self, exp_id: int = 0, server: str | None = None) -> Lease:
        """The experiment's lease; with `server`, lost as soon as this bot may no longer
        change that server (`refusal`)."""
        refused = (
            None
            if server is None
            else functools.partial(self.refusal, server, f"advance experiment {exp_id}")
        )
        return Lease(self.connect, exp_id, stopping=self.stopping, refused=refused)

    # ------------------------------------------------------------------ lifecycle
    def create(self, proposal: ProposalRow, *, approved_by: str) -> int:
        why = self.refusal(proposal.server, "start an experiment")
        if why is not None:
            raise ClaimLost(why)
        deps = experiment_deps(self.config, proposal.server, self.db(), clock=self.clock)
        try:
            return machine.create(
                deps,
                proposal.change,
                actor=proposal.created_by,
                approved_by=approved_by,
                reason=f"approved in chat (proposal {proposal.id})",
                proposal_id=proposal.id,
                owner=self.lease(),
                plan=machine.ApprovedPlan.of_proposal(
                    plan_from_json(proposal.plan), proposal.plan_hash
                ),
            )
        finally:
            deps.client.close()

    def start(self, exp_id: int, *, thread: MessageRef | None, resume: bool = False) -> None:
        """Carry the experiment from now on (once: a second call while it runs does nothing)."""
        if self.stopping.is_set() or exp_id in self.running():
            return
        row = store.get_experiment(self.db(), exp_id)
        why = self.refusal(row.server, f"carry experiment {exp_id}")
        if why is not None:  # left where it stands: neither advanced nor reverted here
            log.error("experiment %s left in %s: %s", exp_id, row.state, why)
            return
        lease = self.lease(exp_id, row.server)
        if not lease.acquire():
            held_by, _ = lease.holder()
            log.info("experiment %s is carried by %s; left to it", exp_id, held_by)
            return
        try:
            self._carry(exp_id, thread, lease, resume)
        except Stopped:  # the bot stopped while it started: the next start resumes it
            log.info("experiment %s not started: kvpilot is stopping", exp_id)
            lease.release()
        except Exception:  # keep the bot alive; the state machine is persisted
            log.exception("experiment %s could not be started", exp_id)
            lease.release()

    def resume_all(self) -> list[int]:
        """After a bot restart: pick up every experiment that was running and that no other
        living kvpilot process carries."""
        resumed = machine.resume_unfinished(self.db(), self.lease, self._resume)
        resume_rollouts(self)  # open fleet rollouts carry on too (bot/chat/rollout.py)
        return resumed

    def _resume(self, row: store.ExperimentRow, lease: Lease) -> int:
        thread = None
        if row.proposal_id is not None:
            thread = chat.find_message(self.db(), "proposal", row.proposal_id, "approval")
        lease.release()  # `start` takes it again, as for a new experiment
        self.start(row.id, thread=thread, resume=True)
        return row.id

    def shutdown(self, *, grace_s: float = 10.0, why: str = "") -> list[dict[str, Any]]:
        """Stop carrying experiments (SIGTERM): each stops at its next step, within `grace_s`
        (a step is short); where each was left is audited. The next start resumes them."""
        with self._lock:  # after this, `ticker` starts no scheduler (see there)
            self.stopping.set()
        carried = self.running()
        deadline = time.monotonic() + grace_s
        for exp_id in carried:
            self.ticker.wait(exp_id, max(0.0, deadline - time.monotonic()))
        still = set(self.running())
        left = [
            {
                "id": row.id,
                "server": row.server,
                "state": str(row.state),
                "stopped": row.id not in still,
            }
            for row in store.active_experiments(self.db())
            if row.id in carried
        ]
        audit.record(
            self.db(),
            audit.BotStopped(actor="kvpilot", created=self.now(), experiments=left, signal=why),
        )
        ticker = self._started_ticker()
        if ticker is not None:  # nothing of a stopped bot fires later (a step, a renewal)
            ticker.shutdown()
        return left

    def abort(self, exp_id: int, *, actor: str) -> None:
        row = store.get_experiment(self.db(), exp_id)
        why = self.refusal(row.server, f"abort experiment {exp_id}")
        if why is not None:  # another bot now acts on the server: no half-revert from here
            raise ClaimLost(why)
        deps = experiment_deps(self.config, row.server, self.db(), clock=self.clock)
        try:
            machine.abort(deps, exp_id, actor=actor, reason=f"aborted by {actor}")
        finally:
            deps.client.close()
        if exp_id not in self.running() and not store.get_experiment(self.db(), exp_id).terminal:
            self.start(exp_id, thread=None)  # nobody is carrying it: carry out the revert

    def join(self, timeout: float | None = None) -> None:
        ticker = self._started_ticker()
        if ticker is None:
            return
        for exp_id in ticker.carrying():
            ticker.wait(exp_id, timeout)

    def running(self) -> list[int]:
        """Experiments this process is carrying now."""
        ticker = self._started_ticker()
        return [] if ticker is None else ticker.carrying()

    def busy(self) -> bool:
        return bool(self.running())

    # ------------------------------------------------------------------ the work
    def _carry(self, exp_id: int, thread: MessageRef | None, lease: Lease, resume: bool) -> None:
        db = open_db(self.config.database, any_thread=True)  # the scheduler's threads share it
        row = store.get_experiment(db, exp_id)
        channel = thread.channel if thread else self._default_channel()
        surface = self.surface_for(channel) if channel else None
        progress_ref = chat.find_message(db, "experiment", exp_id, "progress")
        if surface is not None and progress_ref is None:
            try:
                progress_ref = surface.post(self.progress_message(row, "starting"), thread=thread)
            except Exception as exc:  # the experiment runs without its progress message
                log.warning("experiment %s: posting its progress message failed: %s", exp_id, exc)
            else:
                chat.remember_message(
                    db, "experiment", exp_id, "progress", progress_ref, now=self.now()
                )
        last: list[Any] = [0.0, str(row.state)]

        def on_progress(note: str) -> None:
            if surface is None or progress_ref is None:
                return
            current = store.get_experiment(db, exp_id)
            changed = str(current.state) != last[1]
            if not changed and time.monotonic() - last[0] < self.progress_every_s:
                return
            last[0], last[1] = time.monotonic(), str(current.state)
            try:
                surface.progress(progress_ref, self.progress_message(current, note))
            except Exception as exc:  # a chat hiccup must not stop the experiment
                log.warning("experiment %s: a progress edit failed (%s); it goes on", exp_id, exc)

        deps = experiment_deps(
            self.config, row.server, db, on_progress, clock=self.clock, wall_now=self.now
        )
        deps.lease = lease
        if resume:
            machine.resume_policy(deps, exp_id, actor="kvpilot")

        def ended(final: store.ExperimentRow | None, error: BaseException | None) -> None:
            try:
                self._ended(exp_id, final, error, surface, progress_ref, thread)
            finally:
                lease.release()
                deps.client.close()

        _hand_over(self.ticker, exp_id, deps, ended)

    def _ended(
        self,
        exp_id: int,
        final: store.ExperimentRow | None,
        error: BaseException | None,
        surface: Surface | None,
        progress_ref: MessageRef | None,
        thread: MessageRef | None,
    ) -> None:
        """How an experiment this process carried stopped: logged, or announced in chat."""
        try:
            if isinstance(error, ActingRefused):
                row = store.get_experiment(self.db(), exp_id)
                log.error("experiment %s paused in %s: %s", exp_id, row.state, error)
                if surface is not None:
                    text = paused_text(exp_id, str(row.state), str(error))
                    surface.post(Message.note(text), thread=thread or progress_ref)
            elif isinstance(error, OwnershipLost):
                log.info("experiment %s: stopped carrying it: %s", exp_id, error)
            elif error is not None:
                log.error("experiment %s stopped with an error: %s", exp_id, error)
                if surface is not None:
                    where = thread or progress_ref
                    surface.post(Message.note(stopped_text(exp_id, error)), thread=where)
            elif final is not None and surface is not None:
                self._announce(final, surface, progress_ref, thread)
            if final is not None and final.terminal and self.on_end is not None:
                self.on_end(final)
        except Exception as exc:  # Slack refused or timed out past its retries
            log.warning(
                "experiment %s: telling the channel how it ended failed (%s); a verdict is "
                "posted once Slack takes it",
                exp_id, exc,
            )  # fmt: skip

    def _announce(
        self,
        final: store.ExperimentRow,
        surface: Surface,
        progress_ref: MessageRef | None,
        thread: MessageRef | None,
    ) -> None:
        """The last progress edit, and the verdict with its chart (once): the verdict goes out
        even when the edit fails or there is no progress message."""
        db = self.db()
        exp_id = final.id
        if progress_ref is not None:
            try:
                surface.update(progress_ref, self.progress_message(final, "finished"))
            except Exception as exc:
                log.warning("experiment %s: the last progress edit failed: %s", exp_id, exc)
        if (
            final.state in TERMINAL
            and chat.find_message(db, "experiment", exp_id, "verdict") is None
        ):
            verdict = with_rollout_offer(self, final, self.verdict_message(final))
            ref = surface.post(verdict, thread=thread or progress_ref)
            chat.remember_message(db, "experiment", exp_id, "verdict", ref, now=self.now())
            png = self.chart(final)
            if png is not None:
                surface.upload(
                    png,
                    filename=f"experiment-{exp_id}.png",
                    title=f"Experiment {exp_id}: throughput before and after",
                    thread=thread or progress_ref,
                )
            if self.after_verdict is not None:
                self.after_verdict(final, surface, thread or progress_ref or ref)

    def deliver_owed_verdicts(self) -> list[int]:
        """Post the verdicts that never reached their channel: Slack refused or timed out past
        its retries when the experiment ended, or the bot stopped between the end and the
        post. Each goes out once, in its thread, with what follows it (a campaign's next
        step); experiments ended more than `OWED_FOR` ago, or carried in the terminal (no
        message in chat), are left alone. Called at start and with the bot's periodic tick."""
        db = self.db()
        delivered: list[int] = []
        carried = set(self.running())
        for row in store.ended_since(db, self.now() - OWED_FOR):
            if row.id in carried or chat.find_message(db, "experiment", row.id, "verdict"):
                continue
            progress = chat.find_message(db, "experiment", row.id, "progress")
            thread = None
            if row.proposal_id is not None:
                thread = chat.find_message(db, "proposal", row.proposal_id, "approval")
            where = thread or progress
            if where is None:
                continue
            try:
                self._announce(row, self.surface_for(where.channel), progress, thread)
            except Exception as exc:  # Slack still refuses: the next tick tries again
                log.warning("experiment %s: its verdict is still not posted: %s", row.id, exc)
                continue
            log.info("experiment %s: its verdict, owed since it ended, is posted", row.id)
            delivered.append(row.id)
        return delivered

    def _default_channel(self) -> str | None:
        slack = self.config.slack
        return slack.channels[0] if slack and slack.channels else None

    # ------------------------------------------------------------------ rendering
    def describe(self, row: store.ExperimentRow) -> dict[str, Any]:
        """State, elapsed and remaining time (upper bound), on the experiment's clock; for a
        change waiting for a hold, what holds it and its approval's time left, on the wall
        clock."""
        moves = store.transitions(self.db(), row.id)
        start = moves[0].created_at if moves else row.created_at
        entered = moves[-1].created_at if moves else row.created_at
        now = self.clock.utcnow()
        elapsed = (now - start).total_seconds()
        in_state = (now - entered).total_seconds()
        s = row.settings
        baseline_s = float(s.get("baseline_s", 0))
        trial_s = float(s.get("max_trial_s", 0)) + float(s.get("warmup_s", 0))
        remaining: float | None
        if row.state in (State.proposed, State.approved):
            remaining = baseline_s + trial_s
        elif row.state == State.baseline:
            remaining = max(0.0, baseline_s - in_state) + trial_s
        elif row.state in (State.restarting, State.warming_up):
            remaining = trial_s
        elif row.state == State.trial:
            remaining = max(0.0, trial_s - in_state)
        else:
            remaining = 0.0 if row.terminal else None
        return {
            "id": row.id,
            "server": row.server,
            "state": str(row.state),
            "change": change_text(row.change),
            "elapsed_s": elapsed,
            "remaining_s": remaining,
            "terminal": row.terminal,
            # what holds an approved change, on the wall clock (bot.chat.held)
            "held": held_facts(progress_of(row), self.now())
            if row.state == State.approved
            else None,
        }

    def progress_message(self, row: store.ExperimentRow, note: str) -> Message:
        return Message.from_template("chat/progress.md.j2", e=self.describe(row), note=note)

    def verdict_message(self, row: store.ExperimentRow) -> Message:
        moves = store.transitions(self.db(), row.id)
        result = row.result or {}
        took = (moves[-1].created_at - moves[0].created_at).total_seconds() if moves else 0.0
        end = ending(row, moves)
        return Message.from_template(
            "chat/verdict.md.j2",
            e=self.describe(row),
            r=result,
            reason=end.cause,
            then=end.then,
            took_s=took,
        )

    def chart(self, row: store.ExperimentRow) -> bytes | None:
        samples = sample_store.samples_for(self.db(), row.id)
        if not samples:
            return None
        return verdict_chart(
            samples, row.result or {}, title=f"Experiment {row.id} on {row.server}"
        )


class ClaimLost(ConfigError):
    """This bot may no longer change the server: another bot of the estate claims it now."""


def _hand_over(
    ticker: Ticker,
    exp_id: int,
    deps: machine.Deps,
    ended: Callable[[store.ExperimentRow | None, BaseException | None], None],
) -> None:
    """The experiment to the scheduler; its client closed if the scheduler has stopped."""
    try:
        ticker.carry(exp_id, deps, ended)
    except Stopped:
        deps.client.close()
        raise
