"""The App Home: what waits for a person and what runs, in one place they open themselves.

Pending proposals come with the same Approve and Reject buttons as their messages (same action
ids and values, so the same checks and the same authorisation decide a click there); then the
experiments running, each server's last verdict and the freezes in force. The chat core builds
it as messages; a front end that has a home (Slack's Home tab) shows them one after another.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.chat import freezes
from bot.chat.messages import Button, Message
from bot.chat.render import change_text, mention
from bot.chat.when import hhmm
from playbooks.experiments.plans import plan_from_json
from playbooks.gate.result import GateResult
from storage import chat
from storage import experiments as store
from storage import proposals as proposal_store

if TYPE_CHECKING:
    from bot.chat.conversation import Conversation

MAX_PROPOSALS = 15  # Slack's Home tab holds 100 blocks; each proposal takes about three


def home_messages(bot: Conversation) -> list[Message]:
    db = bot.db()
    now = bot.now()
    pending = [proposal_store.get_proposal(db, pid) for pid in chat.pending_proposals(db)]
    pending = [p for p in pending if p.expires_at > now]
    out = [
        Message.note(
            f"*kvpilot* · {len(pending)} proposal(s) waiting for approval · "
            f"{len(store.active_experiments(db))} experiment(s) running · as of {hhmm(now)}"
        )
    ]
    for row in pending[-MAX_PROPOSALS:]:
        out.append(_proposal(bot, row))
    out.append(_running_and_verdicts(bot))
    return out


def _proposal(bot: Conversation, row: proposal_store.ProposalRow) -> Message:
    option = dict(plan_from_json(row.plan).option or {})
    option.setdefault("title", change_text(row.change))
    full = bot.approval_message(row, option)
    gain = option.get("predicted_throughput_change")
    predicted = f", predicted {gain['low']:+.0%}..{gain['high']:+.0%}" if gain else ""
    text = (
        f":hourglass_flowing_sand: *Proposal {row.id}* for `{row.server}`: "
        f"{option['title']}{predicted}. Proposed by {mention(row.created_by)}; expires "
        f"{hhmm(row.expires_at)}."
    )
    buttons = tuple(
        Button(f"{b.action_id}#{row.id}", b.value, b.label, b.style, b.confirm)
        for b in full.buttons
    )
    return Message.note(text, buttons)


def _running_and_verdicts(bot: Conversation) -> Message:
    db = bot.db()
    lines = ["*Experiments running*"]
    active = store.active_experiments(db)
    lines += [
        f"• {e.id} on `{e.server}`: {str(e.state).replace('_', ' ')} ({change_text(e.change)})"
        for e in active
    ] or ["None."]
    lines.append("*Last verdict per server*")
    for name in sorted(bot.config.servers):
        ended = [e for e in store.list_experiments(db, server=name) if e.terminal]
        if not ended:
            lines.append(f"• `{name}`: no experiment yet")
            continue
        last = ended[0]
        effect = None if last.result is None else GateResult.from_json(last.result).effect
        gain = "" if effect is None else f", {effect.mean:+.1%}"
        lines.append(
            f"• `{name}`: experiment {last.id} {last.state} ({change_text(last.change)}{gain}) "
            f"on {hhmm(last.updated_at)}"
        )
    frozen = freezes.status_lines(bot)
    if frozen:
        lines.append("*Freezes in force*")
        lines += [f"• :ice_cube: {line}" for line in frozen]
    return Message.note("\n".join(lines))
