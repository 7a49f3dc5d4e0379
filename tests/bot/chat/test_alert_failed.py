"""An experiment that ends `failed` is alerted once, in the alerts channel, with a Diagnose
button; other endings are not."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from bot.app.config import parse
from bot.chat.auth import Principal
from bot.chat.messages import Message
from bot.reports.alerts import Alerter
from playbooks.clock import ManualClock
from storage import audit
from storage.chat import MessageRef
from storage.db import open_db
from storage.experiments import ExperimentRow, State

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
    alerter = Alerter(config, lambda: db, ManualClock(epoch=NOW), lambda _c: surface)
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
