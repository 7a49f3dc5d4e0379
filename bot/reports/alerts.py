"""Proactive alerts: KV-bound servers, throughput regressions and failed experiments, said once.

Proactive alerts: kvpilot says so, once, when a server turns KV-bound, when its throughput
falls against the same hour a week before, and when an experiment ends `failed`.

The sampler already sees every server; every `EVERY_S` (of the bot's clock) the alerter judges
each server on what it stored: the engine's own diagnosis rules (`Engine.bottleneck_of`) over
the last `WINDOW_S` of scrapes, and the effective throughput of the last hour against the same
hour a week before (only while requests queued, so a quieter day is not called a regression).
`playbooks.reports.alerting.step` turns the looks into raise and clear with hysteresis, so a
condition is posted once, with its evidence and a Diagnose button, not at every sample; when it
has gone for `[alerts] clear_after`, the alert's message says so (edited, not a new post).
What one look raises and clears in a channel is said in one post or edit of the channel's alert
message (`bot.reports.grouping`), however many servers moved, and the alerter's calls to a
channel are paced to one a second.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import TypeVar

from sqlite_utils import Database

from bot.app.telemetry import Tally
from bot.app.wiring import Posting, engine_of
from bot.chat.messages import Message
from bot.chat.when import hhmm
from bot.reports.grouping import Entry, Group, diagnose_button, render
from playbooks.diagnose.measure import MeasurementError, measurement_of
from playbooks.engines import restore_snapshot
from playbooks.reports.alerting import AlertState, Transition, regressed, step
from playbooks.reports.throughput import choose_level, load_buckets
from storage import alerts as store
from storage import audit
from storage.chat import MessageRef
from storage.experiments import ExperimentRow
from storage.metric_buckets import Bucket
from storage.metric_samples import oldest
from storage.samples import monitor_samples
from storage.server_snapshots import snapshot_at

log = logging.getLogger(__name__)
EVERY_S = 60.0  # how often the servers are judged (bot clock)
WINDOW_S = 600.0  # the scrapes a KV-bound look judges
HOUR_S, WEEK_S = 3600.0, 7 * 86400.0
MIN_SCRAPES = 4
SATURATED = 0.5  # share of the hour with requests waiting, for a fall to count
_T = TypeVar("_T")
PACE_S = 1.0  # Slack's rate for posting: about one message a second per channel
Judged = tuple[bool | None, list[str], float]  # holds, evidence, severity


@dataclass
class _Move:
    """One server's alert after one look: its new state and whether it was raised or cleared."""

    name: str
    kind: str
    moved: Transition
    state: AlertState | None
    extra: dict[str, object]
    evidence: list[str]
    severity: float


class Alerter:
    def __init__(self, posting: Posting, sent: Tally | None = None) -> None:
        self.config = posting.config
        self.db = posting.db
        self.clock = posting.clock
        self.surface_for = posting.surface_for
        self.sent = sent or Tally()
        self._last: float | None = None
        self._open: dict[str, Group] = {}  # each channel's newest alert message
        self._groups: dict[tuple[str, str], Group] = {}  # (channel, ts): messages still alerting
        self._last_call: dict[str, float] = {}  # time.monotonic() of each channel's last call

    @property
    def channel(self) -> str | None:
        a = self.config.alerts
        if not a.enabled:
            return None
        return a.channel or (self.config.channels[0] if self.config.channels else None)

    # ------------------------------------------------------------------ looks
    def maybe_evaluate(self) -> None:
        now = self.clock.utcnow().timestamp()
        if self._last is not None and now - self._last < EVERY_S:
            return
        self._last = now
        self.evaluate(now)

    def evaluate(self, now: float | None = None) -> list[tuple[str, str, str]]:
        """Judge every server once; the alerts raised and cleared, as (server, kind, what).
        What moved is said in one post or edit of the channel's alert message
        (`bot.reports.grouping`), not one message per server."""
        channel = self.channel
        if channel is None:
            return []
        now = self.clock.utcnow().timestamp() if now is None else now
        moves: list[_Move] = []
        for name in self.config.servers:
            for kind, judge in (("kv_bound", self._kv_bound), ("regression", self._regression)):
                try:
                    holds, evidence, severity = judge(name, now)
                    moves.append(self._look(name, kind, holds, evidence, severity, now))
                except Exception:  # one server's bad data must not silence the others
                    log.exception("alert %s for %s could not be judged", kind, name)
        return [(m.name, m.kind, str(m.moved)) for m in self._say(channel, moves, now)]

    def _kv_bound(self, name: str, now: float) -> Judged:
        db = self.db()
        rows = monitor_samples(db, name, now - WINDOW_S, now)
        if len(rows) < MIN_SCRAPES:
            return None, [], 0.0
        settings = snapshot_at(db, name, now)
        if settings is None:
            return None, [], 0.0
        try:
            m = measurement_of([restore_snapshot(r.metrics, r.t) for r in rows], why="alerts")
        except MeasurementError:
            return None, [], 0.0
        engine = engine_of(self.config, name)
        judged = engine.bottleneck_of(engine.parse_settings(settings.info), m)
        if isinstance(judged, str):
            return None, [], 0.0
        bottleneck, evidence = judged
        return bottleneck == "kv_cache", evidence, m.queued  # the more waiting, the worse

    def _regression(self, name: str, now: float) -> Judged:
        share = self.config.alerts.regression
        if share <= 0:
            return None, [], 0.0
        db = self.db()
        hour, week = _hour(db, name, now), _hour(db, name, now - WEEK_S)
        if hour is None or week is None or hour.span_s <= 0:
            return None, [], 0.0
        if hour.saturated_s / hour.span_s < SATURATED:
            return None, [], 0.0  # demand fell, not the server
        now_rate, week_rate = hour.effective_rate(), week.effective_rate()
        holds = regressed(now_rate, week_rate, share)
        if holds is None or now_rate is None or week_rate is None:
            return None, [], 0.0
        return (
            holds,
            [
                f"effective throughput {now_rate:,.0f} tok/s over the last hour, against "
                f"{week_rate:,.0f} tok/s in the same hour a week before "
                f"({now_rate / week_rate - 1:+.0%}), with requests waiting "
                f"{hour.saturated_s / hour.span_s:.0%} of the hour"
            ],
            1 - now_rate / week_rate,
        )

    # ------------------------------------------------------------------ posting
    def _look(
        self,
        name: str,
        kind: str,
        holds: bool | None,
        evidence: list[str],
        severity: float,
        now: float,
    ) -> _Move:
        """One look's step of the hysteresis; `_say` posts what moved, then stores the state."""
        stored = store.get(self.db(), name, kind)
        prev = None
        if stored is not None:
            prev = AlertState(stored.active, stored.since, stored.clear_since)
        a = self.config.alerts
        state, moved = step(prev, holds, now, a.raise_after_s, a.clear_after_s)
        extra = dict(stored.extra) if stored is not None else {}
        return _Move(name, kind, moved, state, extra, evidence, severity)

    def _say(self, channel: str, moves: list[_Move], now: float) -> list[_Move]:
        """Post or edit the channel's alert message once for every alert raised or cleared by
        this look, then store each alert's state; the moves that were said."""
        raised = [m for m in moves if m.moved == "raise"]
        cleared = [m for m in moves if m.moved == "clear"]
        posted = None
        if raised or cleared:
            try:
                ref = self._show(channel, raised, cleared, now)
            except Exception as exc:  # Slack refused or timed out: raised at the next look
                log.warning("alerts of %d server(s): not posted (%s); trying again",
                            len(raised) + len(cleared), exc)  # fmt: skip
                for m in raised:
                    assert m.state is not None
                    m.state, m.moved = AlertState(False, m.state.since), None
            else:
                posted = datetime.now(UTC)
                group = self._groups.get((ref.channel, ref.message_id)) if ref else None
                for m in raised:
                    assert ref is not None
                    text = render([Entry(m.name, m.kind, m.evidence, now)]).text
                    m.extra = {"channel": ref.channel, "ts": ref.message_id, "text": text,
                               "group": group is not None and len(group.entries) > 1}  # fmt: skip
        db = self.db()
        for m in moves:
            new = None
            if m.state is not None:
                new = store.StoredAlert(m.state.active, m.state.since, m.state.clear_since, m.extra)
            store.put(db, m.name, m.kind, new, posted=posted if m.moved == "raise" else None)
            if m.moved == "raise":
                self._record(m.name, m.kind, channel, m.evidence)
        return [m for m in moves if m.moved is not None]

    def _show(
        self, channel: str, raised: list[_Move], cleared: list[_Move], now: float
    ) -> MessageRef | None:
        """At most one post and one edit a message: new alerts join the channel's message of
        the last `group_window` (or open a new one), cleared ones are struck through in theirs."""
        touched: dict[tuple[str, str], Group] = {}
        for m in cleared:
            key = (str(m.extra.get("channel")), str(m.extra.get("ts")))
            group = self._groups.get(key)
            if group is not None and (m.name, m.kind) in group.entries:
                group.entries[(m.name, m.kind)].over = now
                touched[key] = group
            else:
                self._clear_alone(m, now)
        ref = None
        if raised:
            new = {(m.name, m.kind): Entry(m.name, m.kind, m.evidence, now, m.severity)
                   for m in raised}  # fmt: skip
            group = self._open.get(channel)
            if group is None or now - group.opened >= self.config.alerts.group_window_s:
                message = render(list(new.values()))
                ref = self._paced(channel, lambda: self.surface_for(channel).post(message))
                group = self._open[channel] = Group(ref, now, new)
                self._groups[(ref.channel, ref.message_id)] = group
            else:
                if len(group.entries) == 1:
                    self._mark_grouped(group)
                group.entries.update(new)
                ref = group.ref
                touched[(ref.channel, ref.message_id)] = group
        for group in touched.values():
            self._paced(group.ref.channel, partial(self._edit, group.ref, group.message()))
        for key, group in list(self._groups.items()):
            if group is not self._open.get(key[0]) and all(
                e.over is not None for e in group.entries.values()
            ):
                del self._groups[key]  # nothing left to strike through
        return ref

    def _edit(self, ref: MessageRef, message: Message) -> None:
        self.surface_for(ref.channel).update(ref, message)

    def _mark_grouped(self, group: Group) -> None:
        """The message of one alert now names others: clearing that alert after a restart
        must not put its own text back over theirs."""
        db = self.db()
        for name, kind in group.entries:
            stored = store.get(db, name, kind)
            if stored is not None and stored.extra.get("ts") == group.ref.message_id:
                extra = {**stored.extra, "group": True}
                store.put(db, name, kind, store.StoredAlert(
                    stored.active, stored.since, stored.clear_since, extra))  # fmt: skip

    def _clear_alone(self, m: _Move, now: float) -> None:
        """An alert posted before this process started: its own message says it is over; one
        in a message that names other servers is left as it is."""
        channel, ts, text = m.extra.get("channel"), m.extra.get("ts"), m.extra.get("text")
        if m.extra.get("group") or not (
            isinstance(channel, str) and isinstance(ts, str) and isinstance(text, str)
        ):
            return
        done = f"{text}\n:white_check_mark: Over since {hhmm(datetime.fromtimestamp(now, UTC))}."
        try:
            ref = MessageRef(channel, ts)
            self._paced(channel, lambda: self.surface_for(channel).update(ref, Message.note(done)))
        except Exception as exc:  # the alert stays as it was posted
            log.warning("alert %s for %s: marking it over failed: %s", m.kind, m.name, exc)

    def _paced(self, channel: str, call: Callable[[], _T]) -> _T:
        """`call`, at least `PACE_S` after the alerter's last call to the channel ended:
        Slack's rate for posting."""
        wait = self._last_call.get(channel, -PACE_S) + PACE_S - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        try:
            return call()
        finally:
            self._last_call[channel] = time.monotonic()

    def _record(self, name: str, kind: str, channel: str, evidence: list[str]) -> None:
        audit.record(
            self.db(),
            audit.AlertPosted(
                actor="kvpilot",
                created=datetime.now(UTC),
                server=name,
                kind=kind,
                channel=channel,
                evidence={"lines": evidence},
            ),
        )
        self.sent.add(name, kind)

    def experiment_failed(self, row: ExperimentRow) -> None:
        """An experiment ended `failed` (its revert did not bring the server back): post once."""
        channel = self.channel
        if channel is None or str(row.state) != "failed":
            return
        kind = f"failed:{row.id}"
        if store.get(self.db(), row.server, kind) is not None:
            return
        reason = str((row.result or {}).get("reason") or (row.result or {}).get("cause") or "")
        text = (
            f":rotating_light: *Experiment {row.id} on `{row.server}` failed*: the server may "
            f"not be running its last-known-good configuration. {reason}".strip()
        )
        message = Message.note(text, (diagnose_button(row.server),))
        ref = self._paced(channel, lambda: self.surface_for(channel).post(message))
        now = self.clock.utcnow().timestamp()
        extra = {"channel": ref.channel, "ts": ref.message_id}
        store.put(self.db(), row.server, kind, store.StoredAlert(True, now, None, extra))
        self._record(row.server, "experiment_failed", channel, [reason] if reason else [])


def _hour(db: Database, server: str, until: float) -> Bucket | None:
    """The stored samples of the hour before `until`, merged; None when there are none."""
    since = until - HOUR_S
    levels = oldest(db, server)
    if not levels:
        return None
    total = Bucket(start_ts=since, bucket_s=HOUR_S)
    for b in load_buckets(db, server, choose_level(levels, since), since, until):
        total.merge(b)
    return total if total.samples > 0 else None
