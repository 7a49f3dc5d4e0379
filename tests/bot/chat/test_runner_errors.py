"""An experiment that stops on an error says so where its progress was, with what to do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bot.app.config import load
from bot.chat.auth import Principal
from bot.chat.messages import Message
from bot.chat.runner import ExperimentRunner
from playbooks.clock import at_scale
from storage.chat import MessageRef
from storage.db import open_db


class Recorder:
    channel = "C0OPS"

    def __init__(self) -> None:
        self.posts: list[tuple[str, MessageRef | None]] = []

    def post(self, message: Message, *, thread: MessageRef | None = None) -> MessageRef:
        self.posts.append((message.text, thread))
        return MessageRef(self.channel, str(len(self.posts)))

    def update(self, ref: MessageRef, message: Message) -> None:
        raise AssertionError("nothing to update")

    def upload(self, data: bytes, **_: Any) -> None:
        raise AssertionError("nothing to upload")

    def whisper(self, who: Principal, message: Message) -> None:
        raise AssertionError("nothing to whisper")


def test_an_error_that_stops_an_experiment_is_posted_in_its_thread(tmp_path: Path) -> None:
    config_path = tmp_path / "kvpilot.toml"
    config_path.write_text('[servers.kimi]\nurl = "http://127.0.0.1:9"\n')
    config = load(str(config_path))
    surface = Recorder()
    db = open_db(config.database)
    runner = ExperimentRunner(
        config, lambda: db, clock=at_scale(1.0), surface_for=lambda _: surface
    )
    thread = MessageRef("C0OPS", "100.1")
    progress = MessageRef("C0OPS", "100.2", "100.1")
    runner._ended(
        7, None, RuntimeError("the launcher's API answered 503"), surface, progress, thread
    )
    [(text, where)] = surface.posts
    assert where == thread
    assert "Experiment 7 stopped on an error: the launcher's API answered 503" in text
    assert "`/kvpilot abort 7`" in text
