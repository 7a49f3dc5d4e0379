"""The report rendered for people: text (jinja2), a chat message, a PNG chart, and posting.

``render_text`` is the terminal form; ``report_message`` the chat form, a ``Message`` of
neutral parts (a header, fields, lists that say how much they left out) that each front end
renders (Slack's Block Kit in ``bot/slack/blocks.py``), with ``render_text`` as its text and
``summary_line`` for notifications; ``render_chart`` draws throughput and queue depth over
the window with experiments and outages marked; ``post_report`` posts the message through a
``Surface`` and then uploads the chart into its thread.

Times are shown in the time zone given (a report channel's own zone), UTC otherwise.
"""

from __future__ import annotations

import functools
import io
import math
from datetime import datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo

from jinja2 import Environment, pass_context
from jinja2.runtime import Context
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.dates import AutoDateLocator, DateFormatter
from matplotlib.figure import Figure

from bot.chat.messages import Fields, Header, Message, Part, Section, SmallPrint
from bot.chat.render import environment
from bot.chat.surface import Surface
from playbooks.reports.throughput import Estimate, Report
from storage.chat import MessageRef

LIST_CHARS = 3000  # a list longer than this is cut and counted (Slack's section limit)
LINE_CHARS = 600  # one list line at most
MAX_NOTES = 10
VERDICT_COLOURS = {"kept": "#2ca02c", "reverted": "#d62728", "failed": "#8c1515"}
ACTIVE_COLOUR = "#ffbf00"
OUTAGE_COLOUR = "#7f7f7f"
GENERATION_COLOUR = "#1f77b4"
EFFECTIVE_COLOUR = "#ff7f0e"
QUEUE_COLOUR = "#d62728"
RUNNING_COLOUR = "#2ca02c"

Zone = str | tzinfo


def _zone(tz: Zone | None) -> tzinfo:
    if tz is None:
        return ZoneInfo("UTC")
    return ZoneInfo(tz) if isinstance(tz, str) else tz


# ----------------------------------------------------------------------------- formatting
def duration(seconds: float | None) -> str:
    """``45 s``, ``13 min``, ``2 h 05 min``, ``24 h``, ``3 d 4 h``."""
    if seconds is None or not math.isfinite(seconds):
        return "n/a"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min" + (f" {s % 60:02d} s" if s < 600 and s % 60 else "")
    if s < 2 * 86400:
        minutes = (s % 3600) // 60
        return f"{s // 3600} h" + (f" {minutes:02d} min" if minutes else "")
    hours = (s % 86400) // 3600
    return f"{s // 86400} d" + (f" {hours} h" if hours else "")


def when(moment: datetime, tz: Zone | None = None) -> str:
    local = moment.astimezone(_zone(tz))
    return local.strftime("%Y-%m-%d %H:%M ") + (local.tzname() or "")


def setting(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and abs(value) >= 10000:
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def change(values: dict[str, Any]) -> str:
    return " ".join(f"{k}={setting(v)}" for k, v in values.items()) or "(no change)"


def effect(estimate: Estimate) -> str:
    text = f"{estimate.mean:+.1%}"
    if estimate.low is not None and estimate.high is not None:
        text += f" (95% CI {estimate.low:+.1%}..{estimate.high:+.1%})"
    return text


def number(value: float | None, digits: int = 0) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:,.{digits}f}"


def percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


# ----------------------------------------------------------------------------- text
@pass_context
def _when_filter(context: Context, moment: datetime) -> str:
    return when(moment, context["tz"])


@functools.cache
def _environment() -> Environment:
    """One environment (templates compiled once); the time zone comes with each render."""
    env = environment()
    env.filters["when"] = _when_filter
    env.filters["duration"] = duration
    env.filters["setting"] = setting
    env.filters["change"] = change
    env.filters["effect"] = effect
    return env


def render_text(report: Report, tz: Zone | None = None) -> str:
    """The report as plain text (``bot/chat/templates/report.txt.j2``)."""
    return _environment().get_template("report.txt.j2").render(r=report, tz=_zone(tz))


def summary_line(report: Report, tz: Zone | None = None) -> str:
    """One line: the message's notification text."""
    parts = [
        f"{number(report.tokens_generated)} tokens",
        f"{number(report.generation.mean)} tok/s generation",
        f"queue non-empty {percent(report.saturated_share)}",
    ]
    if report.restarts:
        parts.append(f"{report.restarts} restart(s)")
    if report.diagnosis is not None:
        parts.append(f"bottleneck {report.diagnosis.bottleneck}")
    return (
        f"kvpilot report for {report.server} ({duration(report.window_s)} to "
        f"{when(report.until, tz)}): " + ", ".join(parts)
    )


# ----------------------------------------------------------------------------- the message
def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def bullet_lines(title: str, lines: list[str]) -> Section:
    """A section of bullet lines that stays readable: lines past `LIST_CHARS` are counted."""
    text = f"*{title}*"
    for i, line in enumerate(lines):
        more = f"\n…and {len(lines) - i} more"
        candidate = f"{text}\n• {_clip(line, LINE_CHARS)}"
        if len(candidate) + len(more) > LIST_CHARS:
            text += more
            break
        text = candidate
    return Section(text)


def _fields(report: Report) -> Fields:
    r = report
    usage = "not reported"
    if r.usage is not None:
        usage = (
            f"p50 {r.usage.p50:.2f}, p90 {r.usage.p90:.2f}, max {r.usage.max:.2f}\n"
            f"≥ 0.90 for {r.usage.share_above_90:.0%} of the time"
        )
    retractions = (
        number(r.retractions)
        if r.retractions is not None
        else f"seen in {r.retraction_samples} samples"
    )
    values = [
        ("Tokens generated", f"{number(r.tokens_generated)}\n{number(r.prompt_tokens)} prompt"),
        ("Requests completed", number(r.requests_completed)),
        (
            "Generation (decode)",
            f"{number(r.generation.mean)} tok/s avg\npeak {number(r.generation.peak)}",
        ),
        (
            "Effective (completed)",
            f"{number(r.effective.mean)} tok/s avg\nbest 5 min {number(r.effective.peak)}",
        ),
        (
            "Saturated (queue non-empty)",
            f"{percent(r.saturated_share)} of the time ({duration(r.saturated_s)})\n"
            f"avg {number(r.running_mean, 1)} running, {number(r.queue_mean, 1)} waiting",
        ),
        ("KV token usage", usage),
        ("Retractions", retractions),
        (
            "Restarts and downtime",
            f"{r.restarts} restart(s), down {duration(r.downtime_s)}\n"
            f"no data {duration(r.no_data_s)}",
        ),
    ]
    return Fields(tuple(f"*{title}*\n{value}" for title, value in values))


def report_parts(report: Report, tz: Zone | None = None) -> tuple[Part, ...]:
    """The report for a chat: a header, the numbers, then what happened and why."""
    r = report
    zone = _zone(tz)
    parts: list[Part] = [
        Header(f"Throughput report: {r.server}"),
        SmallPrint(
            (
                f"{when(r.since, zone)} to {when(r.until, zone)} · observed "
                f"{duration(r.observed_s)} of {duration(r.window_s)}",
            )
        ),
        _fields(r),
    ]
    if r.diagnosis is not None:
        source = (
            "a fresh measurement"
            if r.diagnosis.source == "live"
            else f"{duration(r.diagnosis.busy_s)} of busy time"
        )
        parts.append(
            bullet_lines(f"Bottleneck: {r.diagnosis.bottleneck} ({source})", r.diagnosis.evidence)
        )
    experiments = [
        f"#{e.id} `{change(e.change)}`: *{e.state}*"
        + (f", decode rate {effect(e.effect)}" if e.effect else "")
        + (f" — {e.reason}" if e.reason else "")
        for e in r.experiments
    ]
    parts.append(bullet_lines("Experiments", experiments or ["none in this window"]))
    if r.config.changes:
        parts.append(
            bullet_lines(
                "Configuration changed",
                [f"`{c.key}`: {setting(c.before)} → {setting(c.after)}" for c in r.config.changes],
            )
        )
    elif r.config.now:
        parts.append(Section("*Configuration* unchanged"))
    if r.outages:
        parts.append(
            bullet_lines(
                "Outages",
                [
                    f"{when(o.start, zone)}: {o.kind.replace('_', ' ')} for "
                    f"{duration(o.duration_s)}" + (", restarted" if o.restarted else "")
                    for o in r.outages
                ],
            )
        )
    if r.notes:
        parts.append(SmallPrint(tuple(r.notes[:MAX_NOTES])))
    return tuple(parts)


def report_message(report: Report, tz: Zone | None = None) -> Message:
    """The report as a message: its parts for a chat, its text for a terminal, and a
    one-line summary for notifications."""
    return Message(
        text=render_text(report, tz),
        parts=report_parts(report, tz),
        summary=summary_line(report, tz),
    )


# ----------------------------------------------------------------------------- chart
def _values(points: list[Any], name: str) -> list[float]:
    return [math.nan if getattr(p, name) is None else float(getattr(p, name)) for p in points]


def render_chart(report: Report, tz: Zone | None = None) -> bytes:
    """A PNG: throughput (top) and queue depth (bottom), experiments and outages shaded."""
    zone = _zone(tz)
    fig = Figure(figsize=(10, 5.6), dpi=100)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    half = timedelta(seconds=report.series_step_s / 2)
    times = [p.start + half for p in report.series]  # each point is its step's mean
    top.plot(
        times,
        _values(report.series, "decode_rate"),
        color=GENERATION_COLOUR,
        label="generation (decode) tok/s",
    )
    top.plot(
        times,
        _values(report.series, "effective"),
        color=EFFECTIVE_COLOUR,
        label="effective (completed) tok/s",
    )
    top.set_ylabel("tokens/s")
    top.set_ylim(bottom=0)
    bottom.fill_between(
        times, _values(report.series, "queue"), color=QUEUE_COLOUR, alpha=0.35, label="waiting"
    )
    bottom.plot(times, _values(report.series, "running"), color=RUNNING_COLOUR, label="running")
    bottom.set_ylabel("requests")
    bottom.set_ylim(bottom=0)
    for o in report.outages:
        for ax in (top, bottom):
            ax.axvspan(o.start, o.end, color=OUTAGE_COLOUR, alpha=0.25, hatch="//", lw=0)
    for e in report.experiments:
        start = max(e.started, report.since)
        end = min(e.finished or report.until, report.until)
        colour = VERDICT_COLOURS.get(e.state, ACTIVE_COLOUR)
        for ax in (top, bottom):
            ax.axvspan(start, end, color=colour, alpha=0.18, lw=0)
        top.annotate(
            f"#{e.id} {change(e.change)}: {e.state}",
            xy=(start, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(2, -12),
            textcoords="offset points",
            fontsize=8,
            color=colour,
        )
    top.set_xlim(report.since, report.until)
    top.legend(loc="lower left", fontsize=8)
    bottom.legend(loc="upper left", fontsize=8)
    bottom.xaxis.set_major_locator(AutoDateLocator(tz=zone))  # type: ignore[no-untyped-call]
    bottom.xaxis.set_major_formatter(DateFormatter("%m-%d %H:%M", tz=zone))  # type: ignore[no-untyped-call]
    top.grid(alpha=0.3)
    bottom.grid(alpha=0.3)
    fig.suptitle(
        f"{report.server}: {when(report.since, zone)} to {when(report.until, zone)}",
        fontsize=11,
    )
    fig.autofmt_xdate()
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


# ----------------------------------------------------------------------------- posting
def chart_filename(report: Report) -> str:
    return f"kvpilot-{report.server}-{report.until:%Y%m%d-%H%M}.png"


def post_report(surface: Surface, report: Report, *, tz: Zone | None = None) -> MessageRef:
    """Post the report through ``surface``, then its chart into the message's thread.

    The surface's errors propagate: the caller decides whether a failure is retried.
    """
    ref = surface.post(report_message(report, tz))
    surface.upload(
        render_chart(report, tz),
        filename=chart_filename(report),
        title=f"{report.server}: throughput and queue depth",
        thread=ref,
    )
    return ref
