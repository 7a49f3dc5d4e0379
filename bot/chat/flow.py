"""The conversation: commands, proposals, approvals and aborts, for every front end.

`Kvpilot.command` and `Kvpilot.action` return at once with what to tell the person now (a
`Reply`) and the slow part as work to run afterwards, so a Slack front end can acknowledge
within 3 s and the terminal can simply run it. Every request is authorised by `bot.chat.auth`
before anything happens, and every refusal is audited. Nothing here knows Slack: messages go
through a `Surface`.

Why it is long: it is the conversation's one entry for every front end (commands, proposals,
approvals, aborts); what each command does is already in its own module.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlite_utils import Database

from bot.app.config import Config, ConfigError, ServerConfig
from bot.app.wiring import (
    Posting,
    diagnose_settings,
    engine,
    engine_client,
    launch_args_of,
    launcher,
    room_before,
)
from bot.chat import campaign, freezes, notify, rollout, views
from bot.chat.approvals import Approvals
from bot.chat.auth import Action, Decision, GroupMembers, Principal, authorise
from bot.chat.commands import Command, CommandError, parse_command, record_id
from bot.chat.conversation import Work
from bot.chat.dispatch import DECIDED_AGAINST_PROPOSER, HANDLERS, Reply
from bot.chat.identity import OPAQUE, Identity
from bot.chat.messages import Button, Message
from bot.chat.render import mention
from bot.chat.routing import drain_text
from bot.chat.runner import ClaimLost, ExperimentRunner
from bot.chat.surface import Surface
from bot.chat.views import ACTIONS, APPROVE, DIAGNOSE, PROPOSE_OPTION, REJECT, ROLLOUT
from bot.reports.alerts import Alerter
from playbooks.clock import Clock
from playbooks.diagnose.measure import MeasurementError
from playbooks.diagnose.playbook import diagnose
from playbooks.engines.base import (
    ArgError,
    EngineClient,
    EngineError,
    MetricsDisabled,
    Rules,
    ServerSettings,
    Snapshot,
)
from playbooks.engines.types import Option
from playbooks.experiments import no_change
from playbooks.experiments.machine import ApprovedPlan
from playbooks.experiments.plans import ExperimentPlan
from playbooks.experiments.sampling import store_scrapes
from playbooks.launchers.base import LaunchError
from storage import audit, chat
from storage import experiments as store
from storage import proposals as proposal_store
from storage.chat import MessageRef
from storage.errors import (
    NotFound,
)

log = logging.getLogger(__name__)


PROPOSABLE = ("recommended", "possible", "needs_opt_in")  # verdicts a Propose button is for


def proposable(option: Mapping[str, Any]) -> bool:
    """Whether a diagnosis's option gets a Propose button (and a button may propose it)."""
    return bool(option.get("change")) and option.get("verdict") in PROPOSABLE


def rules_to_judge(client: EngineClient, info: ServerSettings, cfg: ServerConfig) -> Rules:
    """The engine's rules for judging one change; an engine that cannot reason about this
    server (its `rules_for` raises ValueError, as the interface allows) becomes an
    EngineError, which every front end says in words."""
    try:
        return client.engine.rules_for(info, diagnose_settings(cfg), measured=False)
    except ValueError as exc:
        raise EngineError(f"kvpilot cannot judge a change on this server: {exc}") from exc


class StaleDiagnosis(Exception):
    """An option from a diagnosis of a configuration the server no longer runs."""


class Kvpilot(Approvals):
    """The bot, minus its transport."""

    def __init__(
        self,
        config: Config,
        open_db: Callable[[], Database],
        *,
        group_members: GroupMembers,
        surface_for: Callable[[str], Surface],
        clock: Clock,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        progress_every_s: float = 10.0,
        report_hook: Callable[[Command, Principal, Surface], None] | None = None,
        status_hook: Callable[[], list[str]] | None = None,
        direct: Callable[[str], Surface | None] | None = None,
        ids: Identity = OPAQUE,
    ) -> None:
        self.config = config
        self.ids = ids  # the front end's identity part: its groups, private channels
        self.surface_for = surface_for
        # a person's direct messages with the bot (None where the front end has none)
        self.direct: Callable[[str], Surface | None] = direct or (lambda _user: None)
        self._open_db = open_db
        self._local = threading.local()
        self.group_members = group_members
        self.now = now
        self.clock = clock  # the process's one clock: measurements and experiments run on it
        posting = Posting(config, self.db, clock, surface_for)
        self.runner = ExperimentRunner(posting, now=now, progress_every_s=progress_every_s)
        self.work = ThreadPoolExecutor(max_workers=8, thread_name_prefix="kvpilot-work")
        self._in_flight: set[Future[None]] = set()
        self._in_flight_lock = threading.Lock()
        self.progress_every_s = progress_every_s
        self.report_hook = report_hook
        self.status_hook = status_hook
        self.runner.after_verdict = lambda row, surface, thread: campaign.after_verdict(
            self, row, surface, thread
        )
        self.alerts = Alerter(posting)
        self.runner.on_end = self.alerts.experiment_failed

    # ------------------------------------------------------------------ plumbing
    def db(self) -> Database:
        """This thread's connection (SQLite connections stay in the thread that opened them)."""
        db: Database | None = getattr(self._local, "db", None)
        if db is None:
            db = self._open_db()
            self._local.db = db
        return db

    def refusal(self, server: str, doing: str) -> str | None:
        return self.runner.refusal(server, doing)

    def submit(
        self,
        work: Work,
        surface: Surface,
        on_failure: Callable[[Exception], None] | None = None,
    ) -> Future[None]:
        """Run `work` on the pool; a failure is logged and, with `on_failure`, told to the
        person who asked (the transport knows how to reach them when its channel cannot)."""

        def run() -> None:
            try:
                work(surface)
            except Exception as exc:  # a failed job must not kill the worker pool
                log.exception("kvpilot work failed")
                if on_failure is not None:
                    try:
                        on_failure(exc)
                    except Exception:
                        log.exception("telling the person about a failure failed too")

        future = self.work.submit(run)
        with self._in_flight_lock:
            self._in_flight.add(future)
        future.add_done_callback(self._done)
        return future

    def _done(self, future: Future[None]) -> None:
        with self._in_flight_lock:
            self._in_flight.discard(future)

    def in_flight(self, wait_s: float = 0.0) -> int:
        """Requests still being worked on (queued or running), after waiting up to `wait_s`
        for them to finish."""
        with self._in_flight_lock:
            pending = list(self._in_flight)
        if pending and wait_s > 0:
            futures_wait(pending, timeout=wait_s)
        with self._in_flight_lock:
            return sum(not f.done() for f in self._in_flight)

    def close(self) -> None:
        self.work.shutdown(wait=True, cancel_futures=False)
        self.runner.join()

    def _authorisation(
        self, who: Principal, action: Action, *, proposer: str | None = None
    ) -> Decision:
        return authorise(
            self.config.access,
            who,
            action,
            group_members=self.group_members,
            proposer=proposer,
            channels=self.config.channels,
            ids=self.ids,
        )

    def _check(
        self, who: Principal, action: Action, *, proposer: str | None = None, **where: Any
    ) -> str | None:
        """None if allowed; otherwise the reason, after auditing the refusal."""
        decision = self._authorisation(who, action, proposer=proposer)
        if decision.allowed:
            return None
        self.deny(who, action, decision.reason, **where)
        return decision.reason

    def deny(self, who: Principal, action: str, reason: str, **where: Any) -> None:
        audit.record(
            self.db(),
            audit.AccessDenied(
                actor=who.user,
                created=self.now(),
                action=action,
                reason=reason,
                channel=who.channel,
                **where,
            ),
        )

    # ------------------------------------------------------------------ commands
    def command(self, who: Principal, text: str) -> Reply:
        """Parse and authorise a typed command, then answer it by its handler in `HANDLERS`."""
        if self.runner.stopping.is_set():
            return Reply(Message.note(":hourglass: kvpilot is restarting; try again in a minute."))
        try:
            cmd = parse_command(text, self.config)
        except CommandError as exc:
            return Reply(Message.note(f":warning: {exc}"))
        if cmd.name not in DECIDED_AGAINST_PROPOSER:
            # a campaign's plan is a proposal too: proposing one needs the operator's role
            action: Action = "propose" if cmd.name == "tune" else cmd.name  # type: ignore[assignment]
            refused = self._check(who, action, server=cmd.server, experiment_id=cmd.experiment_id)
            if refused is not None:
                return Reply(Message.note(f":no_entry: Not allowed: {refused}."))
        return HANDLERS[cmd.name](self, who, cmd)

    # ------------------------------------------------------------------ buttons
    def action(self, who: Principal, action_id: str, value: str, where: MessageRef | None) -> Reply:
        action_id = action_id.split("#", 1)[0]  # "#n" keeps ids unique within a message
        if action_id not in ACTIONS:
            self.deny(who, action_id[:80], "unknown button")
            return Reply(Message.note(":warning: That button is not one of kvpilot's."))
        if action_id == DIAGNOSE:
            return self._diagnose_button(who, value, where)
        try:
            first, _, second = value.partition(":")
            ident = record_id(first)  # what SQLite can hold; no sign, no other digits
            if ident is None:
                raise ValueError(value)
            if action_id == PROPOSE_OPTION:
                if record_id(second) is None:  # an index of the options: no -1 for the last
                    raise ValueError(value)
            elif len(second) != 16 or not all(c in "0123456789abcdef" for c in second):
                raise ValueError(value)
        except ValueError:
            verb = {PROPOSE_OPTION: "propose", REJECT: "reject"}.get(action_id, "approve")
            self.deny(who, verb, f"malformed button value {value[:40]!r}")
            return Reply(Message.note(":warning: That button's value is not one kvpilot made."))
        if action_id == PROPOSE_OPTION:
            return Reply(None, lambda s: self.propose_option(who, s, ident, int(second)))
        if action_id == ROLLOUT:
            return Reply(None, lambda s: rollout.roll_out(self, who, s, ident, second, where))
        decision = "approve" if action_id == APPROVE else "reject"
        return Reply(None, lambda s: self.decide(who, s, ident, second, decision, where))

    def _diagnose_button(self, who: Principal, server: str, where: MessageRef | None) -> Reply:
        """An alert's Diagnose button: the server it names, diagnosed in the alert's thread."""
        if server not in self.config.servers:
            self.deny(who, "diagnose", f"button names no configured server {server[:40]!r}")
            return Reply(Message.note(":warning: That server is no longer configured."))
        refused = self._check(who, "diagnose", server=server)
        if refused is not None:
            return Reply(Message.note(f":no_entry: Not allowed: {refused}."))
        return Reply(None, lambda s: self.run_diagnose(server, who, s, thread=where))

    # ------------------------------------------------------------------ diagnose
    def run_diagnose(
        self, server: str, who: Principal, surface: Surface, thread: MessageRef | None = None
    ) -> list[Option] | None:
        """Measure and assess `server`, posting the analysis (in `thread` when given); its
        options, or None when it could not be diagnosed (the message says why)."""
        cfg = self.config.server(server)
        progress = surface.post(
            Message.note(f":hourglass_flowing_sand: Diagnosing `{server}`..."), thread=thread
        )
        last = [time.monotonic()]
        clock = self.clock

        def on_progress(elapsed: float, target: float, note: str) -> None:
            if time.monotonic() - last[0] < self.progress_every_s:
                return
            last[0] = time.monotonic()
            surface.progress(
                progress,
                Message.note(
                    f":hourglass_flowing_sand: Diagnosing `{server}`: measured {elapsed:.0f} s "
                    f"of up to {target:.0f} s. {note}"
                ),
            )

        scrapes: list[Snapshot] = []  # in epoch seconds, as the sampler stores them

        def on_sample(scrape: Snapshot) -> None:
            scrapes.append(scrape.at(clock.utcnow().timestamp()))

        try:
            client = engine_client(
                cfg, clock=clock, launch_args=launch_args_of(self.config, cfg, clock)
            )
            try:
                finding = diagnose(
                    client,
                    clock,
                    diagnose_settings(cfg),
                    on_progress=on_progress,
                    on_sample=on_sample,
                )
            finally:
                client.close()
        except (EngineError, MeasurementError, ValueError) as exc:
            surface.update(progress, Message.note(f":x: Diagnosis of `{server}` failed: {exc}"))
            return None
        data = finding.to_json()
        data["server"] = server
        measured = store_scrapes(self.db(), server, scrapes)
        diag_id = chat.save_diagnosis(
            self.db(), server, data, created_by=who.user, now=self.now(), measured=measured
        )
        buttons = tuple(
            Button(f"{PROPOSE_OPTION}#{i}", f"{diag_id}:{i}", f"Propose: {o['title']}"[:75])
            for i, o in enumerate(data["options"])
            if proposable(o)
        )
        surface.update(
            progress,
            Message.from_template("chat/diagnosis.md.j2", buttons=buttons[:10], f=data),
        )
        chat.remember_message(self.db(), "diagnosis", diag_id, "analysis", progress, now=self.now())
        return finding.options

    # ------------------------------------------------------------------ proposals
    def propose_option(self, who: Principal, surface: Surface, diag_id: int, index: int) -> None:
        try:
            diagnosis = chat.get_diagnosis(self.db(), diag_id)
            option = diagnosis.finding["options"][index]
            if not proposable(option):  # its button was never offered
                raise IndexError(index)
        except (NotFound, IndexError):
            self.deny(who, "propose", f"no option {index} in diagnosis {diag_id}")
            surface.whisper(who, Message.note(":warning: That option no longer exists."))
            return
        if self._check(who, "propose", server=diagnosis.server) is not None:
            surface.whisper(who, Message.note(":no_entry: Only operators may propose changes."))
            return
        try:
            items = [f"{k}={v}" for k, v in option["change"].items()]
            change = engine(self.config.server(diagnosis.server)).parse_change(items)
        except ArgError as exc:
            surface.whisper(who, Message.note(f":warning: {exc}"))
            return
        gain = option.get("predicted_throughput_change")
        predicted = (float(gain["low"]), float(gain["high"])) if isinstance(gain, dict) else None
        measured = (diagnosis.finding.get("capacity") or {}).get("max_total_num_tokens")
        self.propose(
            who, surface, diagnosis.server, change, force=False, diagnosis_id=diag_id,
            predicted=predicted, recommended=option.get("verdict") == "recommended",
            measured_tokens=measured if isinstance(measured, int) else None,
        )  # fmt: skip

    def propose(
        self,
        who: Principal,
        surface: Surface,
        server: str,
        change: dict[str, Any],
        *,
        force: bool,
        diagnosis_id: int | None = None,
        thread: MessageRef | None = None,
        predicted: tuple[float, float] | None = None,
        recommended: bool = False,
        measured_tokens: int | None = None,
    ) -> int | None:
        """Post an approval message for `change` (in `thread`, a campaign's verdict, when
        given); returns the proposal id (None if refused). `predicted`: the throughput change
        the rules predicted against a measurement (a diagnosis, a campaign's last window); the
        message shows it and the trial is sized for it (`gate.settings.sized_for`).
        `recommended`: the measurement recommended it; the check here, of safety alone, can
        only take that back (unsafe, an opt-in), never lower it to "possible".
        `measured_tokens`: the KV capacity the diagnosis measured; a server that has another
        now was reconfigured since, and what was measured no longer describes it."""
        cfg = self.config.server(server)
        lost = self.refusal(server, "propose a change")
        if lost is not None:  # another bot claims the server now
            surface.whisper(who, Message.note(f":no_entry: {lost}."))
            return None
        try:
            srv_launcher = launcher(self.config, cfg, self.clock)
            baseline = srv_launcher.current_args()
            where = no_change.launcher_words(srv_launcher.kind)
            trial = no_change.trial_args(engine(cfg), server, baseline, change, where)
            client = engine_client(
                cfg, clock=self.clock, launch_args=launch_args_of(self.config, cfg, self.clock)
            )
            try:
                info = client.settings()
                if measured_tokens is not None and info.capacity_tokens != measured_tokens:
                    raise StaleDiagnosis(
                        f"diagnosis {diagnosis_id} measured `{server}` with {measured_tokens:,} "
                        f"tokens of KV cache and it has {info.capacity_tokens:,} now (its "
                        "configuration changed since): diagnose it again for options that hold "
                        "today"
                    )
                load = _load(client)
                rules = rules_to_judge(client, info, cfg)
                option = rules.judge(change)
                if predicted is not None and option.verdict != "unsafe":
                    option = replace(option, predicted_gain=predicted)
                if recommended and option.verdict == "possible":
                    option = replace(option, verdict="recommended")
                # what the room after the step is measured against, where the GPUs can be read
                before = room_before(cfg, client, option)
            finally:
                client.close()
        except (no_change.NothingToChange, StaleDiagnosis) as exc:
            self.deny(who, "propose", str(exc), server=server)
            surface.whisper(who, Message.note(f":information_source: Not proposed: {exc}."))
            return None
        except (EngineError, LaunchError, ConfigError, ArgError) as exc:
            surface.whisper(who, Message.note(f":x: Cannot propose a change to `{server}`: {exc}"))
            return None
        if option.verdict == "unsafe" and not force:
            reason = "; ".join(option.reasons)
            self.deny(who, "propose", f"unsafe change refused: {reason}", server=server)
            surface.whisper(
                who,
                Message.note(
                    f":no_entry: `{option.title}` is unsafe on `{server}`: {reason}. "
                    "Add `--force` to propose it anyway (it is reverted if the server fails)."
                ),
            )
            return None
        plan = ExperimentPlan(
            server=server,
            change=change,
            from_args=tuple(baseline),
            to_args=tuple(trial),
            verdict=option.verdict,
            option=option.to_json(),
            gate=ApprovedPlan.build(baseline, trial, cfg.gate, option.predicted_gain).gate,
        )
        snapshot = {
            "args": baseline,
            "max_total_num_tokens": info.capacity_tokens,
            "version": info.version,
            "running": load.running,
            "queued": load.queued,
            "diagnosis_id": diagnosis_id,
            "room": None if before is None else before.to_json(),
        }
        created = self.now()
        ttl = self.config.access.approval_ttl_s if self.config.access else 1800.0
        row = proposal_store.create_proposal(
            self.db(),
            server=server,
            change=change,
            plan=plan.to_json(),
            snapshot=snapshot,
            created_by=who.user,
            now=created,
            expires_at=created + timedelta(seconds=ttl),
        )
        message = self.approval_message(row, option.to_json(), cfg.launcher is not None)
        ref = surface.post(message, thread=thread)
        chat.remember_message(self.db(), "proposal", row.id, "approval", ref, now=self.now())
        notify.announce(self, row, ref, option.to_json())
        return row.id

    def approval_message(
        self, row: proposal_store.ProposalRow, option: dict[str, Any], restartable: bool = True
    ) -> Message:
        if campaign.is_plan(row):
            return campaign.plan_message(row)
        restart_s = views.last_restart_s(self.db(), row.server)
        return views.approval_message(
            row,
            option,
            restartable=restartable,
            restart_s=restart_s,
            drain=drain_text(self.config, row.server),
        )

    # ------------------------------------------------------------------ abort, status, history
    def abort(self, who: Principal, surface: Surface, exp_id: int) -> None:
        try:
            row = store.get_experiment(self.db(), exp_id)
        except NotFound:
            surface.whisper(who, Message.note(f":warning: There is no experiment {exp_id}."))
            return
        if row.terminal:
            surface.whisper(who, Message.note(f"Experiment {exp_id} already ended ({row.state})."))
            return
        try:
            self.runner.abort(exp_id, actor=who.user)
        except ClaimLost as exc:
            surface.whisper(who, Message.note(f":no_entry: {exc}."))
            return
        surface.post(
            Message.note(
                f":octagonal_sign: {mention(who.user)} aborted experiment {exp_id} on "
                f"`{row.server}` (was {row.state}); the last-known-good configuration is "
                "being restored."
            )
        )

    def status_message(self, server: str | None) -> Message:
        hook = self.status_hook() if self.status_hook else []
        return views.status_message(
            self.db(),
            self.config,
            self.runner,
            server,
            schedule=hook,
            frozen=freezes.status_lines(self),
        )

    def history_message(self, server: str | None) -> Message:
        return views.history_message(self.db(), server)


def _load(client: EngineClient) -> Snapshot:
    """The server's load now, from its metrics or, without them, its load report."""
    try:
        return client.snapshot()
    except MetricsDisabled:
        return client.load_snapshot()
