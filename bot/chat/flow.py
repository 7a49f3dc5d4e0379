"""The conversation: commands, proposals, approvals and aborts, for every front end.

`Kvpilot.command` and `Kvpilot.action` return at once with what to tell the person now (a
`Reply`) and the slow part as work to run afterwards, so a Slack front end can acknowledge
within 3 s and the terminal can simply run it. Every request is authorised by `bot.chat.auth`
before anything happens, and every refusal is audited. Nothing here knows Slack: messages go
through a `Surface`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlite_utils import Database

from bot.app.config import Config, ConfigError
from bot.app.wiring import diagnose_settings, engine, engine_client, launcher
from bot.chat import decisions
from bot.chat.auth import Action, Decision, GroupMembers, Principal, authorise
from bot.chat.commands import Command, CommandError, parse_command
from bot.chat.dispatch import DECIDED_AGAINST_PROPOSER, HANDLERS, Reply, Work
from bot.chat.messages import Button, Confirm, Message
from bot.chat.render import mention
from bot.chat.runner import ExperimentRunner
from bot.chat.surface import LOCAL_CHANNEL, Surface
from bot.chat.when import hhmm as _hhmm
from playbooks.clock import Clock
from playbooks.diagnose.measure import MeasurementError
from playbooks.diagnose.playbook import diagnose
from playbooks.engines.base import ArgError, EngineClient, EngineError, MetricsDisabled, Snapshot
from playbooks.launchers.base import LaunchError
from storage import audit, chat
from storage import experiments as store
from storage import proposals as proposal_store
from storage.chat import MessageRef
from storage.errors import (
    ActiveExperimentExists,
    AlreadyDecided,
    NotFound,
    PlanMismatch,
    ProposalExpired,
    StorageError,
)

log = logging.getLogger(__name__)

PROPOSE_OPTION = "kvpilot.propose"
APPROVE = "kvpilot.approve"
REJECT = "kvpilot.reject"
ACTIONS = (PROPOSE_OPTION, APPROVE, REJECT)


class Kvpilot:
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
    ) -> None:
        self.config = config
        self._open_db = open_db
        self._local = threading.local()
        self.group_members = group_members
        self.now = now
        self.clock = clock  # the process's one clock: measurements and experiments run on it
        self.runner = ExperimentRunner(
            config,
            self.db,
            clock=clock,
            surface_for=surface_for,
            now=now,
            progress_every_s=progress_every_s,
        )
        self.work = ThreadPoolExecutor(max_workers=8, thread_name_prefix="kvpilot-work")
        self.progress_every_s = progress_every_s
        self.report_hook = report_hook
        self.status_hook = status_hook

    # ------------------------------------------------------------------ plumbing
    def db(self) -> Database:
        """This thread's connection (SQLite connections stay in the thread that opened them)."""
        db: Database | None = getattr(self._local, "db", None)
        if db is None:
            db = self._open_db()
            self._local.db = db
        return db

    def submit(self, work: Work, surface: Surface) -> Future[None]:
        def run() -> None:
            try:
                work(surface)
            except Exception:  # a failed job must not kill the worker pool
                log.exception("kvpilot work failed")

        return self.work.submit(run)

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
            action: Action = cmd.name  # type: ignore[assignment]
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
        try:
            first, _, second = value.partition(":")
            ident = int(first)
            if action_id == PROPOSE_OPTION:
                int(second)
            elif len(second) != 16 or not all(c in "0123456789abcdef" for c in second):
                raise ValueError(value)
        except ValueError:
            verb = {PROPOSE_OPTION: "propose", APPROVE: "approve", REJECT: "reject"}[action_id]
            self.deny(who, verb, f"malformed button value {value[:40]!r}")
            return Reply(Message.note(":warning: That button's value is not one kvpilot made."))
        if action_id == PROPOSE_OPTION:
            return Reply(None, lambda s: self.propose_option(who, s, ident, int(second)))
        decision = "approve" if action_id == APPROVE else "reject"
        return Reply(None, lambda s: self.decide(who, s, ident, second, decision, where))

    # ------------------------------------------------------------------ diagnose
    def run_diagnose(self, server: str, who: Principal, surface: Surface) -> None:
        cfg = self.config.server(server)
        progress = surface.post(Message.note(f":hourglass_flowing_sand: Diagnosing `{server}`..."))
        last = [time.monotonic()]
        clock = self.clock

        def on_progress(elapsed: float, target: float, note: str) -> None:
            if time.monotonic() - last[0] < self.progress_every_s:
                return
            last[0] = time.monotonic()
            surface.update(
                progress,
                Message.note(
                    f":hourglass_flowing_sand: Diagnosing `{server}`: measured {elapsed:.0f} s "
                    f"of up to {target:.0f} s. {note}"
                ),
            )

        try:
            client = engine_client(cfg)
            try:
                finding = diagnose(client, clock, diagnose_settings(cfg), on_progress=on_progress)
            finally:
                client.close()
        except (EngineError, MeasurementError, ValueError) as exc:
            surface.update(progress, Message.note(f":x: Diagnosis of `{server}` failed: {exc}"))
            return
        data = finding.to_json()
        data["server"] = server
        diag_id = chat.save_diagnosis(self.db(), server, data, created_by=who.user, now=self.now())
        buttons = tuple(
            Button(f"{PROPOSE_OPTION}#{i}", f"{diag_id}:{i}", f"Propose: {o['title']}"[:75])
            for i, o in enumerate(data["options"])
            if o["change"] and o["verdict"] in ("recommended", "possible", "needs_opt_in")
        )
        surface.update(
            progress,
            Message.from_template("chat/diagnosis.md.j2", buttons=buttons[:10], f=data),
        )
        chat.remember_message(self.db(), "diagnosis", diag_id, "analysis", progress, now=self.now())

    # ------------------------------------------------------------------ proposals
    def propose_option(self, who: Principal, surface: Surface, diag_id: int, index: int) -> None:
        try:
            diagnosis = chat.get_diagnosis(self.db(), diag_id)
            option = diagnosis.finding["options"][index]
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
        self.propose(who, surface, diagnosis.server, change, force=False, diagnosis_id=diag_id)

    def propose(
        self,
        who: Principal,
        surface: Surface,
        server: str,
        change: dict[str, Any],
        *,
        force: bool,
        diagnosis_id: int | None = None,
    ) -> int | None:
        """Post an approval message for `change`; returns the proposal id (None if refused)."""
        cfg = self.config.server(server)
        try:
            client = engine_client(cfg)
            try:
                info = client.settings()
                load = _load(client)
            finally:
                client.close()
            srv_launcher = launcher(self.config, cfg, self.clock)
            baseline = srv_launcher.current_args()
            trial = client.engine.with_change(baseline, change)
            rules = client.engine.rules_for(info, diagnose_settings(cfg), measured=False)
            option = rules.judge(change)
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
        plan = {
            "server": server,
            "change": change,
            "from_args": baseline,
            "to_args": trial,
            "verdict": option.verdict,
            "option": option.to_json(),
            "gate": vars(cfg.gate),
        }
        snapshot = {
            "args": baseline,
            "max_total_num_tokens": info.capacity_tokens,
            "version": info.version,
            "running": load.running,
            "queued": load.queued,
            "diagnosis_id": diagnosis_id,
        }
        created = self.now()
        ttl = self.config.access.approval_ttl_s if self.config.access else 1800.0
        row = proposal_store.create_proposal(
            self.db(),
            server=server,
            change=change,
            plan=plan,
            snapshot=snapshot,
            created_by=who.user,
            now=created,
            expires_at=created + timedelta(seconds=ttl),
        )
        message = self.approval_message(row, option.to_json(), cfg.launcher is not None)
        ref = surface.post(message)
        chat.remember_message(self.db(), "proposal", row.id, "approval", ref, now=self.now())
        return row.id

    def approval_message(
        self, row: proposal_store.ProposalRow, option: dict[str, Any], restartable: bool = True
    ) -> Message:
        value = f"{row.id}:{row.plan_hash[:16]}"
        server = row.server
        buttons = (
            Button(
                APPROVE,
                value,
                "Approve",
                "primary",
                Confirm(
                    "Restart and measure?",
                    f"`{server}` restarts with the new arguments, its running requests are "
                    "dropped, and the change is kept only if throughput improves.",
                    "Approve",
                ),
            ),
            Button(
                REJECT,
                value,
                "Reject",
                "danger",
                Confirm("Reject this change?", "Nothing will be changed on the server.", "Reject"),
            ),
        )
        return Message.from_template(
            "chat/proposal.md.j2",
            buttons=buttons if restartable else (),
            p=row,
            o=option,
            diff=_arg_diff(row.plan["from_args"], row.plan["to_args"]),
            gate=row.plan["gate"],
            snap=row.snapshot,
            expires=_hhmm(row.expires_at),
            restart_s=self._last_restart_s(server),
        )

    def _last_restart_s(self, server: str) -> float | None:
        for ev in reversed(audit.events(self.db(), server=server, name="restart_finished")):
            seconds = ev["properties"].get("duration_s")
            if isinstance(seconds, (int, float)):
                return float(seconds)
        return None

    # ------------------------------------------------------------------ decisions
    def decide(
        self,
        who: Principal,
        surface: Surface,
        proposal_id: int,
        hash_prefix: str,
        decision: str,
        where: MessageRef | None,
        *,
        start: bool = True,
    ) -> int | None:
        """Approve or reject; an approval starts the experiment. Returns its id when started.

        The checks and their order are `bot.chat.decisions`'; this reads the facts they need
        (the server's only for an approval that passed the others) and acts on the outcome.
        `start=False` leaves the new experiment to the caller (the command line carries it in
        the foreground)."""
        verb: decisions.Verb = "approve" if decision == "approve" else "reject"
        row = self._proposal_or_say(who, surface, proposal_id, verb)
        if row is None:
            return None
        ids = {"server": row.server, "proposal_id": proposal_id}

        def refuse(reason: str, audited: bool = True) -> None:
            if audited:
                self.deny(who, verb, reason, **ids)
            surface.whisper(who, Message.note(f":no_entry: Not {verb}d: {reason}."))

        outcome = decisions.judge_proposal(self._proposal_facts(who, verb, row, hash_prefix))
        if outcome == decisions.GO_AHEAD and verb == "approve":
            outcome = decisions.judge_server(self._server_facts(row))
        if isinstance(outcome, decisions.Refusal):
            refuse(outcome.text, outcome.audited)
            if outcome.reason is decisions.Reason.EXPIRED:
                self._mark_expired(row)
                ref = where or chat.find_message(self.db(), "proposal", proposal_id, "approval")
                self._stamp(
                    row,
                    ref,
                    surface,
                    f":hourglass: Expired at {_hhmm(row.expires_at)} without approval; "
                    "nothing was changed.",
                )
            return None
        verdict: proposal_store.Decision = "approved" if verb == "approve" else "rejected"
        try:
            proposal_store.decide(
                self.db(),
                proposal_id,
                verdict,
                actor=who.user,
                plan_hash=row.plan_hash,
                now=self.now(),
                reason="rejected in chat" if verdict == "rejected" else "",
            )
        except (AlreadyDecided, ProposalExpired, PlanMismatch) as exc:  # decided meanwhile
            refuse(str(exc))
            return None
        ref = where or chat.find_message(self.db(), "proposal", proposal_id, "approval")
        if verdict == "rejected":
            self._stamp(
                row, ref, surface, f":x: Rejected by {mention(who.user)} at {_hhmm(self.now())}."
            )
            return None
        return self._start_experiment(who, surface, row, ref, start=start)

    def decide_by_id(self, who: Principal, surface: Surface, proposal_id: int, verb: str) -> None:
        """`approve ID` / `reject ID` typed as a command: the proposal as it is stored now."""
        row = self._proposal_or_say(who, surface, proposal_id, verb)
        if row is None:
            return
        ref = chat.find_message(self.db(), "proposal", proposal_id, "approval")
        self.decide(who, surface, proposal_id, row.plan_hash[:16], verb, ref)

    def _proposal_or_say(
        self, who: Principal, surface: Surface, proposal_id: int, verb: str
    ) -> proposal_store.ProposalRow | None:
        """The proposal, or None after auditing and telling `who` that there is none."""
        try:
            return proposal_store.get_proposal(self.db(), proposal_id)
        except NotFound:
            self.deny(who, verb, f"no proposal {proposal_id}", proposal_id=proposal_id)
            surface.whisper(who, Message.note(f":warning: There is no proposal {proposal_id}."))
            return None

    def _proposal_facts(
        self, who: Principal, verb: decisions.Verb, row: proposal_store.ProposalRow, button: str
    ) -> decisions.ProposalFacts:
        earlier = proposal_store.approvals(self.db(), row.id)
        return decisions.ProposalFacts(
            verb=verb,
            proposal_id=row.id,
            authorisation=self._authorisation(who, verb, proposer=row.created_by),
            button_hash=button,
            stored_hash=row.plan_hash,
            earlier=decisions.Earlier(earlier[0].decision, earlier[0].actor) if earlier else None,
            restarting=self.runner.stopping.is_set(),
            now=self.now(),
            expires_at=row.expires_at,
        )

    def _server_facts(self, row: proposal_store.ProposalRow) -> decisions.ServerFacts:
        """The server's launch arguments now (asks its launcher) and its running experiment."""
        cfg = self.config.server(row.server)
        current, error = None, None
        try:
            current = tuple(launcher(self.config, cfg, self.clock).current_args())
        except (LaunchError, ConfigError) as exc:
            error = str(exc)
        active = [e.id for e in store.active_experiments(self.db()) if e.server == row.server]
        return decisions.ServerFacts(
            server=row.server,
            proposed_args=decisions.args_of(row.snapshot.get("args")),
            current_args=current,
            config_error=error,
            running_experiment=active[0] if active else None,
        )

    def _start_experiment(
        self,
        who: Principal,
        surface: Surface,
        row: proposal_store.ProposalRow,
        ref: MessageRef | None,
        *,
        start: bool,
    ) -> int | None:
        """Create the approved experiment, say so on the proposal, and run it unless `start`
        is False; None when it could not be created."""
        try:
            exp_id = self.runner.create(row, approved_by=who.user)
        except (ActiveExperimentExists, StorageError, LaunchError, EngineError) as exc:
            self._stamp(
                row, ref, surface, f":warning: Approved by {mention(who.user)}, not started: {exc}"
            )
            return None
        where_progress = "in the thread" if start else "in the approver's terminal"
        self._stamp(
            row,
            ref,
            surface,
            f":white_check_mark: Approved by {mention(who.user)} at {_hhmm(self.now())}; "
            f"experiment {exp_id} is running (progress {where_progress}).",
        )
        if start:
            self.runner.start(exp_id, thread=ref)
        return exp_id

    def _stamp(
        self, row: proposal_store.ProposalRow, ref: MessageRef | None, surface: Surface, text: str
    ) -> None:
        """Replace the approval message's buttons with who decided and when."""
        option: dict[str, Any] = dict(row.plan.get("option") or {})
        option.setdefault("title", ", ".join(f"{k}={v}" for k, v in row.change.items()))
        option.setdefault("verdict", row.plan.get("verdict", "possible"))
        for key in ("predicted_max_total_num_tokens", "predicted_throughput_change"):
            option.setdefault(key, None)
        option.setdefault("reasons", [])
        message = self.approval_message(row, option).without_buttons(text)
        if ref is not None:
            surface.update(ref, message)
        else:
            surface.post(message)

    def _mark_expired(self, row: proposal_store.ProposalRow) -> None:
        try:
            proposal_store.decide(
                self.db(),
                row.id,
                "rejected",
                actor="kvpilot",
                plan_hash=row.plan_hash,
                now=self.now(),
                reason=f"expired at {_hhmm(row.expires_at)} without approval",
            )
        except AlreadyDecided:
            return

    def expire_proposals(self, surface_for: Callable[[str], Surface]) -> int:
        """Close proposals nobody approved in time; their messages say so. Returns how many."""
        count = 0
        for pid in chat.pending_proposals(self.db()):
            row = proposal_store.get_proposal(self.db(), pid)
            if self.now() < row.expires_at:
                continue
            self._mark_expired(row)
            ref = chat.find_message(self.db(), "proposal", pid, "approval")
            if ref is not None and ref.channel != LOCAL_CHANNEL:  # a terminal's is gone
                self._stamp(
                    row,
                    ref,
                    surface_for(ref.channel),
                    f":hourglass: Expired at {_hhmm(row.expires_at)} without approval; "
                    "nothing was changed.",
                )
            count += 1
        return count

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
        self.runner.abort(exp_id, actor=who.user)
        surface.post(
            Message.note(
                f":octagonal_sign: {mention(who.user)} aborted experiment {exp_id} on "
                f"`{row.server}` (was {row.state}); the last-known-good configuration is "
                "being restored."
            )
        )

    def status_message(self, server: str | None) -> Message:
        db = self.db()
        active = [e for e in store.active_experiments(db) if server in (None, e.server)]
        names = [server] if server else sorted(self.config.servers)
        servers: list[dict[str, Any]] = []
        for name in names:
            cfg = self.config.server(name)
            client = engine_client(cfg, timeout_s=2.0)
            try:
                health = "healthy" if client.health() else "not healthy"
            except EngineError as exc:
                health = f"unreachable ({exc})"
            finally:
                client.close()
            servers.append({"name": name, "url": cfg.url, "health": health})
        return Message.from_template(
            "chat/status.md.j2",
            servers=servers,
            active=[self.runner.describe(e) for e in active],
            pending=len(chat.pending_proposals(db)),
            schedule=self.status_hook() if self.status_hook else [],
        )

    def history_message(self, server: str | None) -> Message:
        rows = store.list_experiments(self.db(), server=server)[:15]
        items = []
        for r in rows:
            result = r.result or {}
            effect = result.get("effect") or {}
            items.append(
                {
                    "id": r.id,
                    "server": r.server,
                    "state": str(r.state),
                    "change": ", ".join(f"{k}={v}" for k, v in r.change.items()),
                    "when": _hhmm(r.created_at),
                    "effect": effect.get("mean"),
                }
            )
        return Message.from_template("chat/history.md.j2", items=items, server=server)


def _arg_diff(before: list[str], after: list[str]) -> str:
    """A unified-diff-like view of the launch arguments, one `--flag value` per line."""

    def pairs(args: list[str]) -> list[str]:
        out: list[str] = []
        for tok in args:
            if tok.startswith("--") or not out:
                out.append(tok)
            else:
                out[-1] += " " + tok
        return out

    old, new = pairs(before), pairs(after)
    lines = [f"- {p}" for p in old if p not in new] + [f"+ {p}" for p in new if p not in old]
    return "\n".join(lines) or "(no change)"


def _load(client: EngineClient) -> Snapshot:
    """The server's load now, from its metrics or, without them, its load report."""
    try:
        return client.snapshot()
    except MetricsDisabled:
        return client.load_snapshot()
