"""An experiment that stops on an error says so where its progress was, with what to do."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bot.app.config import load
from bot.app.wiring import Posting
from bot.chat.auth import Principal
from bot.chat.messages import Message
from bot.chat.runner import ExperimentRunner
from playbooks.clock import at_scale
from storage import experiments as store
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

    def progress(self, ref: MessageRef, message: Message) -> None:
        self.update(ref, message)

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
    runner = ExperimentRunner(Posting(config, lambda: db, at_scale(1.0), lambda _: surface))
    thread = MessageRef("C0OPS", "100.1")
    progress = MessageRef("C0OPS", "100.2", "100.1")
    runner._ended(
        7, None, RuntimeError("the launcher's API answered 503"), surface, progress, thread
    )
    [(text, where)] = surface.posts
    assert where == thread
    assert "Experiment 7 stopped on an error: the launcher's API answered 503" in text
    assert "`/kvpilot abort 7`" in text


def test_an_experiment_started_while_the_bot_stops_starts_no_scheduler(tmp_path: Path) -> None:
    """An approval's work may still be starting its experiment when the bot stops (posting its
    progress message takes a call to the chat): nothing may be scheduled after the stop, or
    the stopped bot leaves a step and its timers running."""
    config_path = tmp_path / "kvpilot.toml"
    config_path.write_text(
        '[servers.kimi]\nurl = "http://127.0.0.1:9"\n[servers.kimi.launcher]\nkind = "process"\n'
        'command = ["true"]\n'
    )
    config = load(str(config_path))
    db = open_db(config.database)
    exp = store.create_experiment(
        db, server="kimi", change={"max_running_requests": 16}, baseline_config={"args": []},
        trial_config={"args": []}, settings={}, actor="U1", now=datetime.now(UTC),
        state=store.State.approved,
    )  # fmt: skip
    surface = Recorder()
    runner: ExperimentRunner

    def stopping_meanwhile(_channel: str) -> Recorder:
        runner.shutdown(grace_s=0.0, why="SIGTERM")  # the stop lands while it starts
        return surface

    runner = ExperimentRunner(Posting(config, lambda: db, at_scale(1.0), stopping_meanwhile))
    before = set(threading.enumerate())
    runner.start(exp, thread=MessageRef("C0OPS", "100.1"))
    started = [t.name for t in set(threading.enumerate()) - before if t.is_alive()]
    assert started == [] and runner.running() == []
    assert store.get_experiment(db, exp).lease_owner is None  # the next start resumes it
