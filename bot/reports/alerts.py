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
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from sqlite_utils import Database

from bot.app.config import Config
from bot.app.telemetry import Tally
from bot.app.wiring import engine_of
from bot.chat.messages import Button, Message
from bot.chat.surface import Surface
from bot.chat.views import DIAGNOSE
from bot.chat.when import hhmm
from playbooks.clock import Clock
from playbooks.diagnose.measure import MeasurementError, measurement_of
from playbooks.engines import restore_snapshot
from playbooks.reports.alerting import AlertState, regressed, step
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
Judged = tuple[bool | None, list[str]]


class Alerter:
    def __init__(
        self,
        config: Config,
        db: Callable[[], Database],
        clock: Clock,
        surface_for: Callable[[str], Surface],
        sent: Tally | None = None,
    ) -> None:
        self.config = config
        self.db = db
        self.clock = clock
        self.surface_for = surface_for
        self.sent = sent or Tally()
        self._last: float | None = None

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
        """Judge every server once; the alerts raised and cleared, as (server, kind, what)."""
        if self.channel is None:
            return []
        now = self.clock.utcnow().timestamp() if now is None else now
        out = []
        for name in self.config.servers:
            for kind, judge in (("kv_bound", self._kv_bound), ("regression", self._regression)):
                try:
                    holds, evidence = judge(name, now)
                    moved = self._look(name, kind, holds, evidence, now)
                except Exception:  # one server's bad data must not silence the others
                    log.exception("alert %s for %s could not be judged", kind, name)
                    continue
                if moved:
                    out.append((name, kind, moved))
        return out

    def _kv_bound(self, name: str, now: float) -> Judged:
        db = self.db()
        rows = monitor_samples(db, name, now - WINDOW_S, now)
        if len(rows) < MIN_SCRAPES:
            return None, []
        settings = snapshot_at(db, name, now)
        if settings is None:
            return None, []
        try:
            m = measurement_of([restore_snapshot(r.metrics, r.t) for r in rows], why="alerts")
        except MeasurementError:
            return None, []
        engine = engine_of(self.config, name)
        judged = engine.bottleneck_of(engine.parse_settings(settings.info), m)
        if isinstance(judged, str):
            return None, []
        bottleneck, evidence = judged
        return bottleneck == "kv_cache", evidence

    def _regression(self, name: str, now: float) -> Judged:
        share = self.config.alerts.regression
        if share <= 0:
            return None, []
        db = self.db()
        hour, week = _hour(db, name, now), _hour(db, name, now - WEEK_S)
        if hour is None or week is None or hour.span_s <= 0:
            return None, []
        if hour.saturated_s / hour.span_s < SATURATED:
            return None, []  # demand fell, not the server
        now_rate, week_rate = hour.effective_rate(), week.effective_rate()
        holds = regressed(now_rate, week_rate, share)
        if holds is None or now_rate is None or week_rate is None:
            return None, []
        return holds, [
            f"effective throughput {now_rate:,.0f} tok/s over the last hour, against "
            f"{week_rate:,.0f} tok/s in the same hour a week before "
            f"({now_rate / week_rate - 1:+.0%}), with requests waiting "
            f"{hour.saturated_s / hour.span_s:.0%} of the hour"
        ]

    # ------------------------------------------------------------------ posting
    def _look(
        self, name: str, kind: str, holds: bool | None, evidence: list[str], now: float
    ) -> str | None:
        db = self.db()
        stored = store.get(db, name, kind)
        prev = None
        if stored is not None:
            prev = AlertState(stored.active, stored.since, stored.clear_since)
        a = self.config.alerts
        state, moved = step(prev, holds, now, a.raise_after_s, a.clear_after_s)
        extra = dict(stored.extra) if stored is not None else {}
        posted = None
        if moved == "raise":
            try:
                extra = self._raise(name, kind, evidence, now)
            except Exception as exc:  # Slack refused or timed out: raised at the next look
                log.warning("alert %s for %s: not posted (%s); trying again", kind, name, exc)
                state = None if state is None else AlertState(False, state.since)
                moved = None
            else:
                posted = datetime.now(UTC)
        elif moved == "clear":
            self._clear(name, kind, extra, now)
        new = (
            None
            if state is None
            else store.StoredAlert(state.active, state.since, state.clear_since, extra)
        )
        store.put(db, name, kind, new, posted=posted)
        return moved

    def _raise(self, name: str, kind: str, evidence: list[str], now: float) -> dict[str, object]:
        channel = self.channel
        assert channel is not None
        since = hhmm(datetime.fromtimestamp(now, UTC))
        title = {
            "kv_bound": f"`{name}` turned KV-cache bound",
            "regression": f"`{name}` is slower than a week ago",
        }[kind]
        lines = "\n".join(f"• {e}" for e in evidence[:6])
        message = Message.note(
            f":rotating_light: *{title}* (seen at {since}).\n{lines}", _diagnose_button(name)
        )
        ref = self.surface_for(channel).post(message)
        self._record(name, kind, channel, evidence)
        return {"channel": ref.channel, "ts": ref.message_id, "text": message.text}

    def _clear(self, name: str, kind: str, extra: dict[str, object], now: float) -> None:
        channel, ts, text = extra.get("channel"), extra.get("ts"), extra.get("text")
        if not (isinstance(channel, str) and isinstance(ts, str) and isinstance(text, str)):
            return
        done = f"{text}\n:white_check_mark: Over since {hhmm(datetime.fromtimestamp(now, UTC))}."
        try:
            self.surface_for(channel).update(MessageRef(channel, ts), Message.note(done))
        except Exception as exc:  # the alert stays as it was posted
            log.warning("alert %s for %s: marking it over failed: %s", kind, name, exc)

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
        ref = self.surface_for(channel).post(Message.note(text, _diagnose_button(row.server)))
        now = self.clock.utcnow().timestamp()
        extra = {"channel": ref.channel, "ts": ref.message_id}
        store.put(self.db(), row.server, kind, store.StoredAlert(True, now, None, extra))
        self._record(row.server, "experiment_failed", channel, [reason] if reason else [])


def _diagnose_button(server: str) -> tuple[Button, ...]:
    return (Button(DIAGNOSE, server, f"Diagnose {server}"[:75], "primary"),)


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
