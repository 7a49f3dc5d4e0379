"""Alerts judged without a twin: an experiment that ends `failed` (once, with a Diagnose
button), and throughput fallen against the same hour a week before."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from bot.app.config import parse
from bot.app.wiring import Posting
from bot.chat.auth import Principal
from bot.chat.messages import Message
from bot.reports.alerts import Alerter
from playbooks.clock import ManualClock
from storage import audit
from storage.chat import MessageRef
from storage.db import open_db
from storage.experiments import ExperimentRow, State
from storage.metric_buckets import RawSample
from storage.metric_samples import add_samples

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


class Recorder:
    def __init__(self, channel: str) -> None:
        self.channel = channel
        self.posted: list[Message] = []

    def post(self, message: Message, *, thread: MessageRef | None = None) -> MessageRef:
        self.posted.append(message)
        return MessageRef(self.channel, f"{len(self.posted)}.0")

    def update(self, ref: MessageRef, message: Message) -> None:
        raise AssertionError("an alert of a failed experiment is never edited")

    def progress(self, ref: MessageRef, message: Message) -> None:
        self.update(ref, message)

    def upload(
        self, data: bytes, *, filename: str, title: str, thread: MessageRef | None = None
    ) -> None:
        raise AssertionError("no uploads")

    def whisper(self, who: Principal, message: Message) -> None:
        raise AssertionError("no whispers")


def row(exp_id: int, state: State) -> ExperimentRow:
    return ExperimentRow(
        exp_id, "a", None, state, {"mem_fraction_static": 0.9}, {}, {}, {},
        {"reason": "the revert did not bring the server back"}, NOW, NOW, NOW, None, None, None, {},
    )  # fmt: skip


def test_a_failed_experiment_is_alerted_once(tmp_path: Path) -> None:
    config = parse(
        {"servers": {"a": {"url": "http://h:1"}}, "alerts": {"channel": "C0OPS"}},
        tmp_path / "k.toml",
    )
    db = open_db(tmp_path / "k.db")
    surface = Recorder("C0OPS")
    alerter = Alerter(Posting(config, lambda: db, ManualClock(epoch=NOW), lambda _c: surface))
    alerter.experiment_failed(row(1, State.reverted))
    assert surface.posted == []
    alerter.experiment_failed(row(2, State.failed))
    alerter.experiment_failed(row(2, State.failed))  # the bot resumed and ended it again
    (message,) = surface.posted
    assert "Experiment 2 on `a` failed" in message.text and "did not bring" in message.text
    assert [(b.action_id, b.value) for b in message.buttons] == [("kvpilot.diagnose", "a")]
    assert [e["properties"]["kind"] for e in audit.events(db, name="alert_posted")] == [
        "experiment_failed"
    ]
    assert alerter.sent.items() == [(("a", "experiment_failed"), 1)]


def hour_of(server: str, end: float, rate: float, queued: float) -> list[RawSample]:
    """An hour of scrapes every 60 s at `rate` completed output tokens per second."""
    return [
        RawSample(
            server, end - 3600 + i * 60, 60.0, 60.0 if i else None,
            gen_tokens=rate * 60, requests=1.0, decode_rate=rate, running=40.0, queued=queued,
        )
        for i in range(1, 61)
    ]  # fmt: skip


def test_a_fall_against_last_week_is_alerted_only_while_requests_wait(tmp_path: Path) -> None:
    config = parse(
        {
            "servers": {"a": {"url": "http://h:1"}},
            "alerts": {"channel": "C0OPS", "raise_after": "1m", "regression": 0.2},
        },
        tmp_path / "k.toml",
    )
    db = open_db(tmp_path / "k.db")
    now = NOW.timestamp()
    add_samples(db, hour_of("a", now - 7 * 86400, 1000.0, 50.0))
    add_samples(db, hour_of("a", now, 700.0, 0.0))  # slower, but nothing waits: less demand
    surface = Recorder("C0OPS")
    alerter = Alerter(Posting(config, lambda: db, ManualClock(epoch=NOW), lambda _c: surface))
    assert alerter._regression("a", now) == (None, [], 0.0)
    db.execute("UPDATE metric_samples SET queued = 30 WHERE ts > ?", [now - 3600])
    holds, evidence, _fall = alerter._regression("a", now)
    assert holds is True and "700 tok/s" in evidence[0] and "(-30%)" in evidence[0]
    alerter.evaluate(now)
    alerter.evaluate(now + 60)  # held a minute: raised
    alerter.evaluate(now + 120)
    (message,) = surface.posted
    assert "`a` is slower than a week ago" in message.text
