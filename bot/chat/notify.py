"""Bringing a proposal to its approvers: a mention or direct messages, and one reminder.

Bringing a proposal to the people who must decide it: a mention of the approvers in its
thread, or a direct message to each with the same buttons (`[notify] approvers`), and one
reminder `[notify] remind_before` its expiry.

Direct messages are copies of the approval message, remembered under the role
`approval-dm:USER`, so that a decision made anywhere is stamped on every copy, and the buttons
of a copy are authorised exactly as the channel's are (`bot.chat.auth`). The proposer is not
sent a copy: under four-eyes they could not approve it, and they know of it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from bot.app.config import LOCAL_PREFIX
from bot.chat.messages import Message
from bot.chat.render import mention
from bot.chat.surface import LOCAL_CHANNEL
from bot.chat.when import hhmm
from storage import chat
from storage import proposals as proposal_store
from storage.chat import MessageRef

if TYPE_CHECKING:
    from bot.chat.conversation import Conversation

log = logging.getLogger(__name__)
DM_ROLE = "approval-dm:"


def _entries(bot: Conversation) -> list[str]:
    """The approvers as the chat names them: users and user groups (local accounts have no
    chat to be reached in)."""
    policy = bot.config.access
    if policy is None:
        return []
    return [e for e in policy.approvers if not e.startswith(LOCAL_PREFIX)]


def _people(bot: Conversation, proposer: str) -> list[str]:
    people: list[str] = []
    for entry in _entries(bot):
        members = sorted(bot.group_members(entry)) if bot.ids.is_group(entry) else [entry]
        people += [m for m in members if m not in people and m != proposer]
    return people


def announce(
    bot: Conversation, row: proposal_store.ProposalRow, ref: MessageRef, option: dict[str, Any]
) -> None:
    """Tell the approvers of a new proposal, as configured; a failure is logged, not raised:
    the proposal stands in its channel either way."""
    how = bot.config.notify.approvers
    if how == "off" or ref.channel == LOCAL_CHANNEL or not _entries(bot):
        return
    try:
        if how == "mention":
            bot.surface_for(ref.channel).post(_ping(bot, row, "waits for an approver"), thread=ref)
            return
        message = bot.approval_message(row, option)
        for user in _people(bot, row.created_by):
            dm = bot.direct(user)
            if dm is None:  # logged by the front end; the others still get theirs
                continue
            copy = dm.post(message)
            chat.remember_message(bot.db(), "proposal", row.id, DM_ROLE + user, copy, now=bot.now())
        if proposal_store.approvals(bot.db(), row.id):
            # decided in the channel while the copies went out: none may keep live buttons
            done = message.without_buttons(
                "Decided meanwhile: its message in the channel says how."
            )
            for ref_ in copies(bot, row.id):
                bot.surface_for(ref_.channel).update(ref_, done)
    except Exception as exc:  # the channel's message stands; nobody was told
        log.warning("proposal %s: telling the approvers failed: %s", row.id, exc)


def _ping(bot: Conversation, row: proposal_store.ProposalRow, what: str) -> Message:
    who = " ".join(mention(e) for e in _entries(bot))
    return Message.note(
        f":bell: {who} proposal {row.id} for `{row.server}` {what}; it expires at "
        f"{hhmm(row.expires_at)} (proposed by {mention(row.created_by)})."
    )


def remind(bot: Conversation) -> list[int]:
    """One reminder per pending proposal, `remind_before` its expiry; returns their ids."""
    before = bot.config.notify.remind_before_s
    how = bot.config.notify.approvers
    if before <= 0 or how == "off":
        return []
    db, now, sent = bot.db(), bot.now(), []
    for pid in chat.pending_proposals(db):
        row = proposal_store.get_proposal(db, pid)
        left = (row.expires_at - now).total_seconds()
        if not 0 < left <= before:
            continue
        ref = chat.find_message(db, "proposal", pid, "approval")
        if ref is None or ref.channel == LOCAL_CHANNEL:
            continue
        if not chat.mark_reminded(db, pid, now=now):
            continue
        what = f"still waits for an approver: {int(left // 60)} min left"
        try:
            if how == "mention":
                bot.surface_for(ref.channel).post(_ping(bot, row, what), thread=ref)
            else:
                for copy in chat.find_messages(db, "proposal", pid, DM_ROLE).values():
                    bot.surface_for(copy.channel).post(_ping(bot, row, what), thread=copy)
        except Exception as exc:
            log.warning("proposal %s: the reminder failed: %s", pid, exc)
            continue
        sent.append(pid)
    return sent


def copies(bot: Conversation, proposal_id: int) -> list[MessageRef]:
    """The proposal's copies in approvers' direct messages."""
    return list(chat.find_messages(bot.db(), "proposal", proposal_id, DM_ROLE).values())
