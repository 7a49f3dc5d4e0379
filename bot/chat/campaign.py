"""Campaigns in chat: the next step after every verdict, and bounded plans approved once.

After any experiment's verdict, kvpilot learns from an out-of-memory failure (a bound for that
server), assesses the server again from the window the experiment already measured, and posts
the next step as a proposal in the verdict's thread, with its buttons, until nothing useful is
left. `/kvpilot tune SERVER --allow KEY=RANGE --max-experiments N` proposes a bounded plan
instead: once a person approves it, each step inside it is proposed by kvpilot and approved in
that person's name (their authority checked again at every step), runs as a gated experiment
in the same thread, and the campaign stops at the plan's limits or its first change not kept.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING

from sqlite_utils import Database

from bot.app.config import ConfigError
from bot.app.wiring import (
    diagnose_settings,
    engine_client,
    launch_args_of,
    launcher,
    room_after,
    unchanged_on,
)
from bot.chat.auth import Principal
from bot.chat.messages import Button, Confirm, Message
from bot.chat.render import mention
from bot.chat.surface import Surface
from bot.chat.views import APPROVE, reject_button
from bot.chat.when import hhmm
from playbooks.campaigns import after
from playbooks.campaigns.policy import (
    Allowance,
    Choice,
    Tried,
    Unchanged,
    campaign_stop,
    choose_next,
)
from playbooks.campaigns.room import RoomBefore
from playbooks.engines.base import EngineError
from playbooks.engines.types import Option
from playbooks.experiments.plans import CampaignPlan, plan_from_json
from playbooks.launchers.base import LaunchError
from storage import campaigns as campaign_store
from storage import chat
from storage import experiments as store
from storage import proposals as proposal_store
from storage.chat import MessageRef
from storage.errors import NotFound

if TYPE_CHECKING:
    from bot.chat.conversation import Conversation

log = logging.getLogger(__name__)

KVPILOT = "kvpilot"  # the proposer of the steps kvpilot works out itself
GOES_ON = (store.State.kept, store.State.reverted)  # a campaign goes on after these only


def after_verdict(
    bot: Conversation, final: store.ExperimentRow, surface: Surface, thread: MessageRef
) -> None:
    """What follows a verdict in its thread; a failure here is said there, never raised."""
    try:
        _after_verdict(bot, final, surface, thread)
    except Exception as exc:  # the verdict is out; the next step is advice
        log.exception("experiment %s: working out the next step failed", final.id)
        surface.post(Message.note(f":warning: No next step: {exc}"), thread=thread)


def _after_verdict(
    bot: Conversation, final: store.ExperimentRow, surface: Surface, thread: MessageRef
) -> None:
    db = bot.db()
    cfg = bot.config.server(final.server)
    client = engine_client(
        cfg, clock=bot.clock, launch_args=launch_args_of(bot.config, cfg, bot.clock)
    )
    try:
        for bound in after.learn(db, final, client.engine, actor=KVPILOT, now=bot.now()):
            surface.post(
                Message.note(
                    f":brain: Learnt for `{final.server}`: {bound.text()}; kvpilot will not "
                    "propose it again (an operator may still, with --force)."
                ),
                thread=thread,
            )
        camp = campaign_store.campaign_of_experiment(db, final.id)
        plan = Allowance.from_json(camp.plan) if camp and camp.approved_by else None
        tried = after.tried_of(db, camp.steps if camp else [final.id])
        stop = None if final.state in GOES_ON else f"experiment {final.id} ended {final.state}"
        if stop is None and plan is not None:
            stop = campaign_stop(tried, plan)
        choice = Choice(None, stop or "")
        if stop is None:
            room = None
            if final.state == store.State.kept:  # measured against the room before the step
                room = room_after(cfg, client, _room_before(db, final))
            choice = after.next_after(
                db, final, client, diagnose_settings(cfg), tried=tried, allowance=plan,
                room=room, unchanged=_unchanged(bot, final.server),
            ).choice  # fmt: skip
    finally:
        client.close()
    take_step(bot, surface, thread, final.server, choice, camp_id=camp.id if camp else None)


def _room_before(db: Database, row: store.ExperimentRow) -> RoomBefore | None:
    """The room its proposal read before the step (None: none was read, or no proposal)."""
    if row.proposal_id is None:
        return None
    try:
        snapshot = proposal_store.get_proposal(db, row.proposal_id).snapshot
    except NotFound:
        return None
    return RoomBefore.from_json(snapshot.get("room"))


def take_step(
    bot: Conversation,
    surface: Surface,
    thread: MessageRef,
    server: str,
    choice: Choice,
    *,
    camp_id: int | None,
) -> None:
    """Propose the chosen step in the thread (and approve it in the plan's name when a bounded
    plan covers it), or say why there is none and end the campaign."""
    db = bot.db()
    camp = campaign_store.get_campaign(db, camp_id) if camp_id is not None else None
    if choice.option is None:
        passed = "".join(f"\n• {title}: {why}" for title, why in choice.skipped)
        label = f"Campaign {camp.id}" if camp else f"`{server}`"
        surface.post(
            Message.note(f":checkered_flag: {label}: {choice.stop}.{passed}"), thread=thread
        )
        if camp is not None:
            campaign_store.end_campaign(db, camp.id, choice.stop, actor=KVPILOT, now=bot.now())
        return
    option = choice.option
    proposal_id = bot.propose(
        Principal(KVPILOT, thread.channel),
        surface,
        server,
        dict(option.change),
        force=False,
        thread=thread,
        predicted=option.predicted_gain,
    )
    if proposal_id is None or camp is None or camp.approved_by is None:
        return
    row = proposal_store.get_proposal(db, proposal_id)
    approver = Principal(camp.approved_by, thread.channel)
    ref = chat.find_message(db, "proposal", proposal_id, "approval")
    exp_id = bot.decide(approver, surface, proposal_id, row.plan_hash[:16], "approve", ref)
    if exp_id is None:  # refused (the approver's authority, the server): the message says why
        campaign_store.end_campaign(
            db, camp.id, f"step {proposal_id} was not approved", actor=KVPILOT, now=bot.now()
        )
        return
    campaign_store.add_step(db, camp.id, exp_id, now=bot.now())


# --------------------------------------------------------------------------- bounded plans
def propose_plan(
    bot: Conversation, who: Principal, surface: Surface, server: str, plan: Allowance
) -> int | None:
    """Post a bounded plan for approval (Approve/Reject, like any proposal); its id."""
    cfg = bot.config.server(server)
    lost = bot.refusal(server, "propose a campaign")
    if lost is not None:  # another bot claims the server now
        surface.whisper(who, Message.note(f":no_entry: {lost}."))
        return None
    try:
        current = launcher(bot.config, cfg, bot.clock).current_args()
        client = engine_client(
            cfg, clock=bot.clock, launch_args=launch_args_of(bot.config, cfg, bot.clock)
        )
        try:
            allowed = client.engine.allowed_args()
            load = client.load_snapshot()
        finally:
            client.close()
    except (EngineError, LaunchError, ConfigError) as exc:
        surface.whisper(who, Message.note(f":x: Cannot propose a campaign on `{server}`: {exc}"))
        return None
    unknown = [key for key in plan.ranges if key not in allowed]
    if unknown:
        surface.whisper(
            who,
            Message.note(
                f":warning: `{unknown[0]}` is not an argument kvpilot may change on `{server}` "
                f"(it may: {', '.join(sorted(allowed))})."
            ),
        )
        return None
    body = CampaignPlan(
        server=server,
        campaign=plan,
        from_args=tuple(current),
        to_args=tuple(current),
        gate=vars(cfg.gate),
        verdict="possible",
        option={"title": f"campaign: {plan.text()}", "reasons": []},
    )
    snapshot = {"args": current, "running": load.running, "queued": load.queued}
    created = bot.now()
    ttl = bot.config.access.approval_ttl_s if bot.config.access else 1800.0
    row = proposal_store.create_proposal(
        bot.db(),
        server=server,
        change={},
        plan=body.to_json(),
        snapshot=snapshot,
        created_by=who.user,
        now=created,
        expires_at=created + timedelta(seconds=ttl),
    )
    ref = surface.post(plan_message(row))
    chat.remember_message(bot.db(), "proposal", row.id, "approval", ref, now=bot.now())
    return row.id


def is_plan(row: proposal_store.ProposalRow) -> bool:
    return isinstance(plan_from_json(row.plan), CampaignPlan)


def _allowance(row: proposal_store.ProposalRow) -> Allowance:
    """What the approval of a campaign's proposal allows its steps."""
    plan = plan_from_json(row.plan)
    assert isinstance(plan, CampaignPlan), f"proposal {row.id} is no campaign's plan"
    return plan.campaign


def plan_message(row: proposal_store.ProposalRow) -> Message:
    """A bounded plan with exactly what its approval allows, and Approve/Reject."""
    plan = _allowance(row)
    value = f"{row.id}:{row.plan_hash[:16]}"
    buttons = (
        Button(
            APPROVE,
            value,
            "Approve plan",
            "primary",
            Confirm(
                "Approve this campaign?",
                f"kvpilot may restart `{row.server}` up to {plan.max_experiments} time(s) "
                "within this plan, in your name; each change is measured and kept only if "
                "throughput improves.",
                "Approve",
            ),
        ),
        reject_button(value, "plan"),
    )
    ranges = [f"`{key}` in {r.text()}" for key, r in sorted(plan.ranges.items())]
    return Message.from_template(
        "chat/campaign_plan.md.j2",
        buttons=buttons,
        p=row,
        plan=plan,
        ranges=ranges,
        expires=hhmm(row.expires_at),
    )


def start_plan(
    bot: Conversation,
    who: Principal,
    surface: Surface,
    row: proposal_store.ProposalRow,
    ref: MessageRef | None,
) -> int | None:
    """An approved plan: the campaign is recorded in the approver's name, the server
    diagnosed in the plan's thread, and the first step taken there."""
    db = bot.db()
    camp = campaign_store.start_campaign(
        db,
        server=row.server,
        plan=_allowance(row).to_json(),
        created_by=row.created_by,
        approved_by=who.user,
        now=bot.now(),
    )
    bot._stamp(
        row,
        ref,
        surface,
        f":white_check_mark: Approved by {mention(who.user)} at {hhmm(bot.now())}; campaign "
        f"{camp.id} starts with a diagnosis (progress in the thread).",
    )
    thread = ref or surface.post(Message.note(f"Campaign {camp.id} on `{row.server}`"))

    def first_step(s: Surface) -> None:
        options = bot.run_diagnose(row.server, who, s, thread=thread)
        if options is None:
            campaign_store.end_campaign(
                bot.db(), camp.id, "the server could not be diagnosed", actor=KVPILOT, now=bot.now()
            )
            return
        choice = first_choice(bot, row.server, options, Allowance.from_json(camp.plan))
        take_step(bot, s, thread, row.server, choice, camp_id=camp.id)

    bot.submit(first_step, surface)
    return None


def first_choice(bot: Conversation, server: str, options: list[Option], plan: Allowance) -> Choice:
    bounds = after.bounds_of(bot.db(), server)
    tried: list[Tried] = []
    return choose_next(
        options, tried=tried, bounds=bounds, allowance=plan, unchanged=_unchanged(bot, server)
    )


def _unchanged(bot: Conversation, server: str) -> Unchanged | None:
    """Which changes the server already runs (passed over); None where its launcher cannot say
    now: the experiment's own creation asks it again before anything is recorded."""
    try:
        return unchanged_on(bot.config, bot.config.server(server), bot.clock)
    except (ConfigError, LaunchError) as exc:
        log.warning("%s: which changes it already runs is unknown: %s", server, exc)
        return None
