"""Approving and rejecting proposals, and starting the approved experiment.

Approving and rejecting proposals: the checks (`bot.chat.decisions`), then the decision
stored, the approval message stamped, and the approved experiment started.

`Approvals` is a part of `bot.chat.flow.Kvpilot`, kept apart because deciding is the one place
a person's click becomes a restart; it reads the attributes and methods declared below, which
`Kvpilot` provides.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlite_utils import Database

from bot.app.config import Config, ConfigError
from bot.app.holds import hold_for
from bot.app.wiring import engine, launcher
from bot.chat import campaign, decisions
from bot.chat.auth import Action, Decision, Principal
from bot.chat.messages import Message
from bot.chat.notify import DM_ROLE
from bot.chat.render import change_text, mention
from bot.chat.runner import ExperimentRunner
from bot.chat.surface import LOCAL_CHANNEL, Surface
from bot.chat.when import hhmm as _hhmm
from playbooks.clock import Clock
from playbooks.engines.base import ArgError, EngineError
from playbooks.experiments import no_change
from playbooks.experiments.plans import plan_from_json
from playbooks.launchers.base import LaunchError
from playbooks.launchers.gitops import ManagedByGitOps
from storage import chat, freezes
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


class Approvals:
    """Approve and reject, for `Kvpilot` (which provides what is declared here)."""

    config: Config
    clock: Clock
    runner: ExperimentRunner
    now: Callable[[], datetime]
    surface_for: Callable[[str], Surface]

    def db(self) -> Database:
        raise NotImplementedError

    def deny(self, who: Principal, action: str, reason: str, **where: Any) -> None:
        raise NotImplementedError

    def _authorisation(
        self, who: Principal, action: Action, *, proposer: str | None = None
    ) -> Decision:
        raise NotImplementedError

    def approval_message(
        self, row: proposal_store.ProposalRow, option: dict[str, Any], restartable: bool = True
    ) -> Message:
        raise NotImplementedError

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
        refused: Callable[[decisions.Refusal], None] | None = None,
    ) -> int | None:
        """Approve or reject; an approval starts the experiment. Returns its id when started.

        The checks and their order are `bot.chat.decisions`'; this reads the facts they need
        (the server's only for an approval that passed the others) and acts on the outcome.
        `start=False` leaves the new experiment to the caller (the command line carries it in
        the foreground); `refused` is told a refusal (the command line's exit status)."""
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
            lost = self.runner.refusal(row.server, "approve a change")
            outcome = (
                decisions.judge_server(self._server_facts(row))
                if lost is None
                else decisions.Refusal(decisions.Reason.CLAIM_LOST, lost)
            )
        if isinstance(outcome, decisions.Refusal):
            refuse(outcome.text, outcome.audited)
            if refused is not None:
                refused(outcome)
            self._close_refused(row, outcome, where, surface)
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
        ref = self._approval_ref(proposal_id, where)
        if verdict == "rejected":
            self._stamp(
                row, ref, surface, f":x: Rejected by {mention(who.user)} at {_hhmm(self.now())}."
            )
            return None
        return self._start_experiment(who, surface, row, ref, start=start)

    def _close_refused(
        self,
        row: proposal_store.ProposalRow,
        outcome: decisions.Refusal,
        where: MessageRef | None,
        surface: Surface,
    ) -> None:
        """A proposal that can never run any more is closed, and its message says why: one
        that expired, and one that would change nothing on the server as it runs now."""
        if outcome.reason is decisions.Reason.EXPIRED:
            self._close(row, f"expired at {_hhmm(row.expires_at)} without approval")
            stamp = f":hourglass: Expired at {_hhmm(row.expires_at)} without approval"
        elif outcome.reason is decisions.Reason.NOTHING_TO_CHANGE:
            why = outcome.text.removesuffix("; nothing was changed")
            self._close(row, why)
            stamp = f":information_source: Closed: {why}"
        else:
            return
        ref = self._approval_ref(row.id, where)
        self._stamp(row, ref, surface, f"{stamp}; nothing was changed.")

    def _approval_ref(self, proposal_id: int, where: MessageRef | None) -> MessageRef | None:
        """The proposal's message in its channel, where its experiment's thread is, whichever
        copy was clicked (an approver's direct message is stamped with the rest)."""
        return chat.find_message(self.db(), "proposal", proposal_id, "approval") or where

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
        current, error, unchanged = None, None, None
        try:
            found = launcher(self.config, cfg, self.clock)
            current = tuple(found.current_args())
            where = no_change.launcher_words(found.kind)
            unchanged = no_change.unchanged_by(engine(cfg), row.server, current, where)(row.change)
        except (LaunchError, ConfigError) as exc:
            error = str(exc)
        active = [e.id for e in store.active_experiments(self.db()) if e.server == row.server]
        return decisions.ServerFacts(
            server=row.server,
            proposed_args=decisions.args_of(row.snapshot.get("args")),
            current_args=current,
            config_error=error,
            running_experiment=active[0] if active else None,
            unchanged=unchanged,
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
        is False; None when it could not be created. An approved campaign plan starts its
        campaign instead (`bot.chat.campaign`)."""
        if campaign.is_plan(row):
            return campaign.start_plan(self, who, surface, row, ref)  # type: ignore[arg-type]
        try:
            exp_id = self.runner.create(row, approved_by=who.user)
        except (ActiveExperimentExists, StorageError, LaunchError, EngineError, ArgError) as exc:
            self._stamp(
                row,
                ref,
                surface,
                f":warning: Approved by {mention(who.user)}, not started: {not_started(exc)}",
            )
            return None
        where_progress = "in the thread" if start else "in the approver's terminal"
        waits = self._waits(row)
        # Started before the approval message is stamped: the experiment is recorded as
        # approved, and a chat that fails to take an edit (Slack rate-limiting past the
        # client's retries) must not leave it waiting for nobody.
        if start:
            self.runner.start(exp_id, thread=ref)
        try:
            self._stamp(
                row,
                ref,
                surface,
                f":white_check_mark: Approved by {mention(who.user)} at {_hhmm(self.now())}; "
                + (
                    f"experiment {exp_id} waits: {waits}"
                    if waits
                    else f"experiment {exp_id} is running (progress {where_progress})."
                ),
            )
        except Exception as exc:  # the buttons stay; a second click is told it was decided
            log.warning("experiment %s: marking its approval message failed: %s", exp_id, exc)
        return exp_id

    def _waits(self, row: proposal_store.ProposalRow) -> str:
        """Why an approved change cannot start yet (a freeze, the change window) and until
        when, saying so when its approval runs out first; "" when it starts now."""
        now = self.now()
        hold = hold_for(self.config.server(row.server), freezes.active(self.db(), now), now)
        if hold is None:
            return ""
        text = f"{hold.why}. It starts then if its approval is still valid (until "
        text += f"{_hhmm(row.expires_at)})."
        if hold.until_ts is None or hold.until_ts >= row.expires_at.timestamp():
            text += (
                " :warning: The approval runs out before that: unless the hold lifts sooner, "
                "the change will not run. Set a longer `[access] approval_ttl` for changes "
                "that wait for a window, and propose again."
            )
        return text

    def _stamp(
        self, row: proposal_store.ProposalRow, ref: MessageRef | None, surface: Surface, text: str
    ) -> None:
        """Replace the approval message's buttons with who decided and when."""
        plan = plan_from_json(row.plan)
        option: dict[str, Any] = dict(plan.option or {})
        option.setdefault("title", change_text(row.change))
        option.setdefault("verdict", "possible" if plan.verdict is None else plan.verdict)
        for key in ("predicted_max_total_num_tokens", "predicted_throughput_change"):
            option.setdefault(key, None)
        option.setdefault("reasons", [])
        message = self.approval_message(row, option).without_buttons(text)
        if ref is not None:
            surface.update(ref, message)
        else:
            surface.post(message)
        for copy in chat.find_messages(self.db(), "proposal", row.id, DM_ROLE).values():
            try:
                self.surface_for(copy.channel).update(copy, message)
            except Exception as exc:  # the channel's message says it; a copy may lag
                log.warning("proposal %s: stamping the copy in %s failed: %s", row.id, copy, exc)

    def _close(self, row: proposal_store.ProposalRow, reason: str) -> None:
        """Record the proposal as rejected by kvpilot itself, with why (none may approve it)."""
        try:
            proposal_store.decide(
                self.db(),
                row.id,
                "rejected",
                actor="kvpilot",
                plan_hash=row.plan_hash,
                now=self.now(),
                reason=reason,
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
            self._close(row, f"expired at {_hhmm(row.expires_at)} without approval")
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


def not_started(exc: Exception) -> str:
    """Why an approved change did not start; a patch to commit elsewhere as a code block."""
    if isinstance(exc, ManagedByGitOps):
        text = exc.reason
        cut = text.find("\n[")
        return (
            (text[:cut] if cut >= 0 else text)
            + "\n```\n"
            + json.dumps(exc.patch, indent=2)
            + "\n```"
        )
    return str(exc)
