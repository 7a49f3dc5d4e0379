"""The App Home: what waits for a person and what runs, in one place they open themselves.

A summary comes first (how many proposals wait, experiments run, servers need attention, the
freezes in force), then one page of items: the pending proposals, with the same Approve and
Reject buttons as their messages (same action ids and values, so the same checks and the same
authorisation decide a click there), then the experiments running, then the servers whose last
experiment needs a person (failed, or superseded by a change made outside kvpilot), then every
other server's last verdict. At hundreds of servers that is many pages: Previous and Next buttons
(`HOME_PAGE`, the page number as their value) ask the front end to show another page. The chat
core builds it as messages; a front end that has a home (Slack's Home tab) shows them one after
another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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

HOME_PAGE = "kvpilot.home_page"  # Previous/Next; the value is the page to show
PAGE_ITEMS = 15  # a page's items: 15 proposals take about 45 of Slack's 100 blocks a tab
LINE_CHARS = 180  # one item line at most: a page's lines stay within a 3,000-character section
SHOWN_FREEZES = 5
ATTENTION = frozenset({store.State.failed, store.State.superseded})
HEADINGS = {
    "running": "*Experiments running*",
    "attention": "*Needs attention*",
    "server": "*Last verdict per server*",
}


@dataclass(frozen=True)
class Item:
    """One entry of the list: a proposal (its own message, with buttons) or a line under its
    kind's heading (`HEADINGS`)."""

    kind: str  # "proposal", "running", "attention" or "server"
    line: str = ""
    message: Message | None = None


def page_count(items: int, size: int = PAGE_ITEMS) -> int:
    return max(1, math.ceil(items / size))


def parse_page(value: str) -> int:
    """The page a Previous/Next button asks for; anything but a plain page number (a garbled
    or forged value) is page 1."""
    text = value.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 6:
        return 1
    return max(1, int(text))


def page_of(items: list[Item], page: int, size: int = PAGE_ITEMS) -> tuple[int, list[Item]]:
    """The page shown and its items; a page past the last (the list shrank since the button
    was drawn) shows page 1."""
    if not 1 <= page <= page_count(len(items), size):
        page = 1
    return page, items[(page - 1) * size : page * size]


def page_buttons(page: int, pages: int) -> tuple[Button, ...]:
    """Previous and Next where there is a page to go to; distinct action ids (Slack refuses
    a repeated one within a block), the page as their value."""
    out: list[Button] = []
    if page > 1:
        out.append(Button(f"{HOME_PAGE}#previous", str(page - 1), "‹ Previous"))
    if page < pages:
        out.append(Button(f"{HOME_PAGE}#next", str(page + 1), "Next ›"))
    return tuple(out)


def home_messages(bot: Conversation, page: int = 1) -> list[Message]:
    db = bot.db()
    now = bot.now()
    pending = [proposal_store.get_proposal(db, pid) for pid in chat.pending_proposals(db)]
    pending = [p for p in pending if p.expires_at > now]
    active = store.active_experiments(db)
    items = [Item("proposal", message=_proposal(bot, row)) for row in pending]
    items += [
        Item(
            "running",
            f"• {e.id} on `{e.server}`: {str(e.state).replace('_', ' ')} ({change_text(e.change)})",
        )
        for e in active
    ]
    servers = _servers(bot)
    attention = [i for i in servers if i.kind == "attention"]
    items += attention + [i for i in servers if i.kind != "attention"]
    pages = page_count(len(items))
    page, shown = page_of(items, page)
    summary = (
        f"*kvpilot* · {len(pending)} proposal(s) waiting for approval · "
        f"{len(active)} experiment(s) running · {len(attention)} server(s) need attention · "
        f"{len(servers)} server(s) · as of {hhmm(now)}"
    )
    out = [Message.note(summary + _freezes(bot))]
    out += [i.message for i in shown if i.message is not None]
    lines: list[str] = []
    for i, item in enumerate(shown):
        if item.message is not None:
            continue
        if i == 0 or shown[i - 1].kind != item.kind:
            lines.append(HEADINGS[item.kind])
        lines.append(item.line[:LINE_CHARS])
    if lines:
        out.append(Message.note("\n".join(lines)))
    if pages > 1:
        first, last = (page - 1) * PAGE_ITEMS + 1, (page - 1) * PAGE_ITEMS + len(shown)
        out.append(
            Message.note(
                f"Page {page} of {pages} · items {first}-{last} of {len(items)}",
                page_buttons(page, pages),
            )
        )
    return out


def _freezes(bot: Conversation) -> str:
    frozen = freezes.status_lines(bot)
    if not frozen:
        return ""
    lines = [f"• :ice_cube: {line[:LINE_CHARS]}" for line in frozen[:SHOWN_FREEZES]]
    if len(frozen) > SHOWN_FREEZES:
        lines.append(f"…and {len(frozen) - SHOWN_FREEZES} more (`/kvpilot status`)")
    return "\n*Freezes in force*\n" + "\n".join(lines)


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


def _servers(bot: Conversation) -> list[Item]:
    """Each server's last verdict, as an item: `attention` where a person must look."""
    db = bot.db()
    out: list[Item] = []
    for name in sorted(bot.config.servers):
        ended = [e for e in store.list_experiments(db, server=name) if e.terminal]
        if not ended:
            out.append(Item("server", f"• `{name}`: no experiment yet"))
            continue
        last = ended[0]
        effect = None if last.result is None else GateResult.from_json(last.result).effect
        gain = "" if effect is None else f", {effect.mean:+.1%}"
        kind = "attention" if last.state in ATTENTION else "server"
        out.append(
            Item(
                kind,
                f"• `{name}`: experiment {last.id} {last.state} ({change_text(last.change)}"
                f"{gain}) on {hhmm(last.updated_at)}",
            )
        )
    return out
