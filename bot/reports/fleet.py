"""A group's or the fleet's report as one message: totals, the servers losing most, the rest summed.

The ranking is ``playbooks.reports.fleet`` (time lost: unobserved plus the larger of queued and
KV-bound time); this module words it. One message whatever the number of servers: a header, the
window, the totals as fields, the servers named (each with its one-line reason, the list cut and
counted at Slack's section limit by ``bullet_lines``) and the rest in one line, so at 500 servers
it is a handful of blocks. The terminal prints the same content as text. No chart: one chart per
server is what the per-server report is for (`report NAME`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime

from bot.chat.messages import Fields, Header, Message, Part, Section, SmallPrint
from bot.chat.surface import Surface
from bot.reports.report import Zone, bullet_lines, duration, number, when
from playbooks.reports.fleet import FleetSummary, Rest, ServerLine, summarise
from playbooks.reports.throughput import Report
from storage.chat import MessageRef

RANKING = "worst first by time lost: down or unseen, plus queued or KV-bound time"

Build = Callable[[str, datetime, datetime], Report]


def reason(line: ServerLine) -> str:
    """What the server lost most time to, in a few words."""
    cause = line.cause
    restarts = f", {line.restarts} restart(s)" if line.restarts else ""
    bottleneck = f", bottleneck {line.bottleneck}" if line.bottleneck else ""
    share = line.queued_s / line.window_s if line.window_s > 0 else 0.0
    words = {
        "no_data": "no samples in the window",
        "healthy": "healthy",
        "down": f"down {duration(line.down_s)}{restarts}",
        "unobserved": f"not seen for {duration(line.unobserved_s)}{restarts}",
        "queued": f"requests waited {share:.0%} of the time{bottleneck}{restarts}",
        "kv_bound": f"KV cache ≥ 0.90 for {duration(line.kv_bound_s)}{bottleneck}{restarts}",
        "restarts": f"{line.restarts} restart(s)",
    }
    return words[cause]


def server_text(line: ServerLine) -> str:
    """One named server: what it lost, why, and what it served."""
    lost = line.lost_s / line.window_s if line.window_s > 0 else 0.0
    return (
        f"`{line.server}` lost {duration(line.lost_s)} ({lost:.0%}): {reason(line)} · "
        f"{number(line.effective)} tok/s"
    )


def rest_text(rest: Rest, named: bool) -> str:
    more = "more " if named else ""
    return (
        f"…and {rest.servers} {more}server(s): {number(rest.effective)} tok/s effective in "
        f"total, {number(rest.tokens)} tokens, {rest.healthy} healthy"
    )


def label(group: str) -> str:
    """What a summary covers, in words: `*` is every configured server."""
    return "the fleet" if group == "*" else f"group {group}"


def _title(summary: FleetSummary) -> str:
    return f"Throughput report: {summary.name} ({summary.servers} servers)"


def _totals(summary: FleetSummary) -> list[tuple[str, str]]:
    return [
        ("Servers", f"{summary.servers}, {summary.healthy} healthy"),
        ("Effective (completed)", f"{number(summary.effective)} tok/s in total"),
        ("Tokens generated", number(summary.tokens)),
    ]


def fleet_parts(summary: FleetSummary, tz: Zone | None = None) -> tuple[Part, ...]:
    s = summary
    parts: list[Part] = [
        Header(_title(s)[:150]),
        SmallPrint((f"{when(s.since, tz)} to {when(s.until, tz)} · {RANKING}",)),
        Fields(tuple(f"*{title}*\n{value}" for title, value in _totals(s))),
    ]
    if s.shown:
        title = "Losing the most" if s.rest is not None else "Servers"
        parts.append(bullet_lines(title, [server_text(line) for line in s.shown]))
    if s.rest is not None:
        parts.append(Section(rest_text(s.rest, bool(s.shown))))
    return tuple(parts)


def fleet_text(summary: FleetSummary, tz: Zone | None = None) -> str:
    """The same content as plain text, for the terminal."""
    s = summary
    title = _title(s)
    lines = [title, "=" * min(len(title), 72)]
    lines.append(f"{when(s.since, tz)} to {when(s.until, tz)} ({RANKING})")
    lines += [f"{name}: {value}" for name, value in _totals(s)]
    if s.shown:
        lines.append("")
        lines.append("Losing the most:" if s.rest is not None else "Servers:")
        lines += [f"  {server_text(line).replace('`', '')}" for line in s.shown]
    if s.rest is not None:
        lines.append(rest_text(s.rest, bool(s.shown)))
    return "\n".join(lines) + "\n"


def fleet_message(summary: FleetSummary, tz: Zone | None = None) -> Message:
    s = summary
    return Message(
        text=fleet_text(s, tz),
        parts=fleet_parts(s, tz),
        summary=(
            f"kvpilot report for {s.name}: "
            f"{s.servers} servers, {s.healthy} healthy, {number(s.effective)} tok/s"
        ),
    )


def build_fleet(
    name: str, servers: Iterable[str], since: datetime, until: datetime, build: Build
) -> FleetSummary:
    """Each server's report over one window, summarised (`playbooks.reports.fleet`)."""
    return summarise(name, [build(server, since, until) for server in servers])


def post_fleet(surface: Surface, summary: FleetSummary, *, tz: Zone | None = None) -> MessageRef:
    """Post the summary through ``surface``; its errors propagate, as ``post_report``'s do."""
    return surface.post(fleet_message(summary, tz))
