"""The process that runs the bot, whichever front end it speaks through.

A front end (Slack's `bot/slack/serve.py`, the terminal's `bot/console/terminal.py`) brings a
way to reach a channel (`surface_for`), its identity part (`bot.chat.identity.Identity`) and,
where it has them, user groups and direct messages; it builds one `Runtime` and lets it run
everything else: the process's one clock, the chat flow (`Kvpilot`), the sampler, the report
scheduler, the experiments a previous process left running, the periodic duties, health,
telemetry and the orderly stop.

A long-running front end (`duties=True`: Slack, or any chat service) also takes the duties that
speak in the deployment's channels and are recorded as done once: scheduled reports, the
verdicts owed from before a restart, expiring proposals, reminding approvers, alerts. A
foreground session (the console) does not: its surface is one terminal, and a report or a
verdict it claimed would be marked sent where nobody else reads it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from sqlite_utils import Database

from bot.app import health, telemetry
from bot.app.claims import ClaimKeeper
from bot.app.config import Config
from bot.app.wiring import engine_of, make_clock
from bot.chat import notify
from bot.chat.auth import GroupMembers
from bot.chat.flow import Kvpilot
from bot.chat.identity import Identity
from bot.chat.surface import Surface
from bot.reports.hook import make_report_hook
from bot.reports.sampler import Sampler
from bot.reports.sampler_process import SamplerProcess, samples_in_a_process
from bot.reports.sampler_state import SamplerStatus
from bot.reports.schedule import ReportScheduler
from storage.db import open_db
from storage.experiments import count_by_state
from storage.report_runs import last_sent

log = logging.getLogger(__name__)
TICK_S = 30.0  # how often proposals expire, approvers are reminded and alerts are judged
# How long a stopping bot waits for its experiments to reach a check (a scrape, at most
# `scrape_s` away); one inside a restart is left to the next start. Inside the 30 s
# TimeoutStopSec of deploy/systemd/kvpilot.service.
STOP_GRACE_S = 20.0


def no_groups(_group: str) -> frozenset[str]:
    return frozenset()


class Runtime:
    """One bot process: its clock, chat flow, sampler, schedules, and their start and stop."""

    def __init__(
        self,
        config: Config,
        *,
        surface_for: Callable[[str], Surface],
        ids: Identity,
        group_members: GroupMembers = no_groups,
        direct: Callable[[str], Surface | None] | None = None,
        duties: bool = True,
        progress_every_s: float = 10.0,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        tick_s: float = TICK_S,
        heartbeat: Callable[[], None] = lambda: None,
    ) -> None:
        """`heartbeat` runs first in every tick (Slack asks whether it still answers)."""
        self.config = config
        self.ids = ids
        self.duties = duties
        self.tick_s = tick_s
        self.heartbeat = heartbeat
        self.clock = make_clock(config, open_db(config.database))  # this process's one clock
        self.sampler: SamplerStatus = (
            SamplerProcess(config, self.clock)
            if samples_in_a_process(config)
            else Sampler(config, open_db(config.database), self.clock)
        )
        self.scheduler = ReportScheduler(config, open_db(config.database), surface_for=surface_for)
        self.flow = Kvpilot(
            config,
            lambda: open_db(config.database),
            clock=self.clock,
            group_members=group_members,
            surface_for=surface_for,
            progress_every_s=progress_every_s,
            now=now,
            report_hook=make_report_hook(
                self.db, self.clock.utcnow, lambda name: engine_of(config, name)
            ),
            status_hook=self._status,
            direct=direct,
            ids=ids,
        )
        self.surface_for = surface_for
        # the estate's claims on this bot's servers (`[kvpilot] claims`; None for a lone bot)
        self.claims = ClaimKeeper.of(config)
        if self.claims is not None:  # a server lost to another bot is changed no more
            self.flow.runner.refusal = self.claims.refusal
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self.started_at = datetime.now(UTC)

    def db(self) -> Database:
        return self.flow.db()

    def _status(self) -> list[str]:
        return self.sampler.describe() + (self.scheduler.describe() if self.duties else [])

    # ------------------------------------------------------------------ start
    def start(self) -> list[int]:
        """Claim the servers (`bot.app.claims`: ClaimRefused, before anything starts, when
        another live bot holds one), resume the experiments a previous process left running,
        start sampling, and with `duties` send the reports missed while the bot was down and
        start the tick loop. Returns the experiments resumed."""
        if self.claims is not None:
            self.claims.take("start this bot")
            self.claims.start()
        resumed = self.flow.runner.resume_all()
        if resumed:
            log.info("resumed experiments %s", resumed)
        self.sampler.start()
        if self.duties:
            for result in self.scheduler.start():  # reports missed while the bot was down
                log.info("report %s for %s: %s", result.report, result.scheduled_for, result.status)
            self._ticker = threading.Thread(
                target=self._tick_loop, name="kvpilot-tick", daemon=True
            )
            self._ticker.start()
        return resumed

    def _tick_loop(self) -> None:
        """Proposals expire, and verdicts the chat refused when they were due are posted; the
        first pass at once (a verdict owed from before a restart goes out at start)."""
        while True:
            self.heartbeat()
            try:
                self.flow.runner.deliver_owed_verdicts()
            except Exception as exc:
                log.warning("posting owed verdicts failed: %s", exc)
            if self._stop.wait(self.tick_s):
                return
            for job, what in (
                (lambda: self.flow.expire_proposals(self.surface_for), "expiring proposals"),
                (lambda: notify.remind(self.flow), "reminding approvers"),
                (self.flow.alerts.maybe_evaluate, "judging alerts"),
            ):
                try:
                    job()
                except Exception:  # each job on its own: one failing must not stop the rest
                    log.exception("%s failed", what)

    # ------------------------------------------------------------------ stop
    def stop(self, why: str = "") -> None:
        """A service stopping (SIGTERM): start no more work, let running experiments stop at
        their next check (where each was left is audited; the next start resumes them), then
        stop the sampler, the schedules and the chat's work pool without waiting for it."""
        self._stop.set()
        for left in self.flow.runner.shutdown(grace_s=STOP_GRACE_S, why=why):
            log.info(
                "experiment %s on %s left in %s%s; the next start resumes it",
                left["id"],
                left["server"],
                left["state"],
                "" if left["stopped"] else " (inside a restart)",
            )
        self.sampler.stop()
        if self.duties:
            self.scheduler.shutdown(wait=False)
        self.flow.work.shutdown(wait=False, cancel_futures=True)
        self._release()

    def close(self) -> None:
        """A foreground session ending (the console): its commands ran to their end while the
        person watched, so the work they started is waited for, not left for a next start."""
        self._stop.set()
        self.sampler.stop()
        self.flow.close()
        self._release()

    def _release(self) -> None:
        """The claims go last, once nothing of this process acts on the servers."""
        if self.claims is not None:
            released = self.claims.stop()
            if released:
                log.info("released %d claim(s)", released)

    # ------------------------------------------------------------------ watching it
    def health(self, transport: health.Part, **about: Any) -> tuple[int, dict[str, Any]]:
        """200 when the transport answers, the database takes writes and the sampler keeps
        sampling; else 503 with the failing parts' reasons (`bot.app.health`)."""
        status, body = health.verdict(
            [
                transport,
                health.database(Path(self.config.database)),
                health.sampler(self.sampler.health_view()),
            ]
        )
        body.update(
            about,
            started_at=self.started_at.isoformat(timespec="seconds"),
            experiments_running=self.flow.runner.busy(),
        )
        if self.claims is not None:  # servers another bot claims now: this one only reads them
            body["claims_lost"] = self.claims.lost_view()
        return status, body

    def metrics_registry(
        self, transport_errors: telemetry.Tally, transport_connected: Callable[[], bool]
    ) -> CollectorRegistry:
        return telemetry.registry(
            telemetry.Sources(
                experiments=lambda: count_by_state(self.db()),
                sampler_lag=self.sampler.lag_s,
                sampler_failures=self._sampler_failures,
                slack_errors=transport_errors,
                slack_connected=transport_connected,
                reports_sent=self._reports_sent,
                scheduler_jobs=self.scheduler.jobs,
                alerts=self.flow.alerts.sent,
            )
        )

    def _sampler_failures(self) -> Mapping[str, int]:
        return {name: s.failures for name, s in self.sampler.states.items()}

    def _reports_sent(self) -> Mapping[str, float]:
        return {name: at.timestamp() for name, at in last_sent(self.db()).items()}

    def in_flight(self, wait_s: float = 0.0) -> int:
        return self.flow.in_flight(wait_s=wait_s)
