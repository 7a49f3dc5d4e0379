"""Alerts of many servers in one message a channel, edited in place as more arrive.

A fleet turns KV-bound together (a traffic surge, a shared prompt grown longer): one message per
server would bury the channel and run into Slack's rate of about one message a second per
channel. So the alerts a channel receives within `[alerts] group_window` of its newest alert
message share that message: the first alert is posted as it always was (one server, its
evidence, a Diagnose button), and each one after it edits the message into a list that names
the first `SHOWN` by severity (KV-bound before slower-than-a-week-ago, then the most requests
waiting, or the largest fall) and counts the rest. An alert that is over is struck through in
place. This module is transport-neutral: it builds a `Message`; the front end renders it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from bot.chat.messages import Button, Message
from bot.chat.views import DIAGNOSE
from bot.chat.when import hhmm
from storage.chat import MessageRef

SHOWN = 10  # servers named in a grouped message; the rest are counted
EVIDENCE_CHARS = 160  # one line of evidence per server in a grouped message
KIND_ORDER = {"kv_bound": 0, "regression": 1}
TITLES = {"kv_bound": "turned KV-cache bound", "regression": "is slower than a week ago"}
SHORT = {"kv_bound": "KV-cache bound", "regression": "slower than a week ago"}


@dataclass
class Entry:
    """One server's alert in a channel's message."""

    server: str
    kind: str
    evidence: list[str]
    seen: float  # when it was raised (epoch seconds of the bot's clock)
    severity: float = 0.0  # larger is worse, within a kind
    over: float | None = None  # when it cleared

    def key(self) -> tuple[int, int, float, str]:
        return (self.over is not None, KIND_ORDER.get(self.kind, 9), -self.severity, self.server)


@dataclass
class Group:
    """A channel's alert message and the alerts it names."""

    ref: MessageRef
    opened: float  # when its first alert was raised
    entries: dict[tuple[str, str], Entry] = field(default_factory=dict)

    def message(self) -> Message:
        return render(list(self.entries.values()))


def diagnose_button(server: str) -> Button:
    return Button(DIAGNOSE, server, f"Diagnose {server}"[:75], "primary")


def _at(t: float) -> str:
    return hhmm(datetime.fromtimestamp(t, UTC))


def render(entries: list[Entry]) -> Message:
    """One alert as it has always been posted; several as one list, worst first."""
    if len(entries) == 1:
        (e,) = entries
        lines = "\n".join(f"• {x}" for x in e.evidence[:6])
        text = f":rotating_light: *`{e.server}` {TITLES[e.kind]}* (seen at {_at(e.seen)}).\n{lines}"
        if e.over is not None:
            return Message.note(f"{text}\n:white_check_mark: Over since {_at(e.over)}.")
        return Message.note(text, (diagnose_button(e.server),))
    ordered = sorted(entries, key=Entry.key)
    active = [e for e in ordered if e.over is None]
    counts: dict[str, int] = {}
    for e in active:
        counts[e.kind] = counts.get(e.kind, 0) + 1
    what = ", ".join(f"{n} {SHORT[k]}" for k, n in sorted(counts.items(), key=lambda x: x[0]))
    first = min(e.seen for e in entries)
    head = (
        f":rotating_light: *{len(active)} of {len(entries)} servers alerting* "
        f"({what or 'all over'}; since {_at(first)})."
    )
    rows = [_row(e) for e in ordered[:SHOWN]]
    rest = ordered[SHOWN:]
    if rest:
        still = sum(1 for e in rest if e.over is None)
        rows.append(f"…and {len(rest)} more ({still} still alerting)")
    # one Diagnose button, for the worst: Slack allows an action once in a block, and
    # `/kvpilot diagnose NAME` reaches the others
    buttons = (diagnose_button(active[0].server),) if active else ()
    return Message.note("\n".join([head, *rows]), buttons)


def _row(e: Entry) -> str:
    evidence = (e.evidence[0] if e.evidence else "")[:EVIDENCE_CHARS]
    name = f"`{e.server}` {SHORT[e.kind]}"
    if e.over is not None:
        return f"• ~{name}~ :white_check_mark: over since {_at(e.over)}"
    return f"• {name} (seen at {_at(e.seen)}): {evidence}".rstrip(": ")
