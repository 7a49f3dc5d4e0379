"""Edits that hold up no one (`bot.slack.edits`): the caller goes on, each message's newest
content is sent, in the order the messages were first edited, and an edit that must be done
waits for it and gets its error."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest

from bot.chat.messages import Message
from bot.slack.edits import ATTEMPTS, EditQueue
from bot.slack.pacing import ChannelPacer
from bot.slack.surface import SlackSurface, web_client
from storage.chat import MessageRef
from tests.slackfake import FakeSlack


class Gate:
    """A send that blocks until released, so the test decides what waits in the queue."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self) -> None:
        self.entered.set()
        assert self.release.wait(10)


def _append(sent: list[str], text: str) -> Callable[[], None]:
    return lambda: sent.append(text)


def test_the_caller_goes_on_and_only_the_newest_content_of_each_message_is_sent() -> None:
    queue = EditQueue()
    sent: list[str] = []
    busy = Gate()
    queue.submit("m0", busy, wait=False)  # the sender is now held in this send
    assert busy.entered.wait(10)
    for i in range(5):
        queue.submit("m1", _append(sent, f"m1 v{i}"), wait=False)  # returns at once
    queue.submit("m2", lambda: sent.append("m2 v0"), wait=False)
    queue.submit("m1", lambda: sent.append("m1 v5"), wait=False)  # m1 keeps its place
    assert queue.pending() == 2
    busy.release.set()
    assert queue.drain(10)
    assert sent == ["m1 v5", "m2 v0"]
    assert not any(t.name == "kvpilot-edits" for t in threading.enumerate())


def test_an_edit_that_must_be_done_waits_and_no_older_progress_lands_after_it() -> None:
    queue = EditQueue()
    sent: list[str] = []
    busy = Gate()
    queue.submit("other", busy, wait=False)
    assert busy.entered.wait(10)
    queue.submit("m", lambda: sent.append("progress"), wait=False)
    done = threading.Thread(
        target=queue.submit, args=("m", lambda: sent.append("verdict")), kwargs={"wait": True}
    )
    done.start()
    busy.release.set()
    done.join(10)
    assert not done.is_alive()
    assert sent == ["verdict"]


def test_the_error_of_an_edit_reaches_whoever_waits_and_is_logged_otherwise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = EditQueue(retry_s=0.01)
    tries: list[str] = []

    def fails() -> None:
        tries.append("sent")
        raise RuntimeError("message_not_found")

    with pytest.raises(RuntimeError, match="message_not_found"):
        queue.submit("m", fails, wait=True)
    assert tries == ["sent"]  # whoever waits decides what to do
    with caplog.at_level(logging.WARNING, logger="bot.slack.edits"):
        queue.submit("m", fails, wait=False)
        assert queue.drain(10)
    assert len(tries) == 1 + ATTEMPTS
    assert "an edit of a message failed (message_not_found); trying again" in caplog.text
    assert f"failed (message_not_found) {ATTEMPTS} time(s); giving it up" in caplog.text


def test_the_last_news_of_a_message_is_sent_again_after_a_failure() -> None:
    """A rollout's end is an edit nobody waits for: lost to one failed call (after the client's
    own retries), its message would show an older state for good."""
    queue = EditQueue(retry_s=0.01)
    sent: list[str] = []

    def once_refused() -> None:
        if not sent:
            sent.append("refused")
            raise RuntimeError("internal_error")
        sent.append("rollout ended: 99 kept")

    queue.submit("m", once_refused, wait=False)
    assert queue.drain(10)
    assert sent == ["refused", "rollout ended: 99 kept"]


def test_newer_content_replaces_an_edit_waiting_to_be_tried_again() -> None:
    now = [0.0]  # the queue's clock, moved by hand: the retry cannot come first
    queue = EditQueue(retry_s=0.2, monotonic=lambda: now[0])
    sent: list[str] = []

    def refused() -> None:
        sent.append("old")
        raise RuntimeError("internal_error")

    queue.submit("m", refused, wait=False)
    while queue.pending() == 0 or not sent:  # the first send failed; its retry waits
        threading.Event().wait(0.01)
    queue.submit("m", _append(sent, "new"), wait=False)
    now[0] += 1.0
    assert queue.drain(10)
    assert sent == ["old", "new"]


def test_progress_over_the_local_slack_ends_with_the_newest_content() -> None:
    with FakeSlack() as slack:
        client = web_client("xoxb-test", slack.api_url)
        client.edit_pacer = ChannelPacer(per_s=20.0, burst=1)  # Slack's rule, faster
        surface = SlackSurface(client, "C1")
        ref = surface.post(Message.note("starting"))
        for i in range(30):
            surface.progress(ref, Message.note(f"measured {i} s"))
        surface.update(ref, Message.note("kept"))
        assert client.edits is not None and client.edits.drain(10)
        edits = slack.calls("chat.update")
        assert 1 <= len(edits) < 30, "every superseded edit was sent"
        assert slack.messages("C1")[ref.message_id]["text"] == "kept"


def test_a_client_without_a_queue_edits_at_once() -> None:
    with FakeSlack() as slack:
        client = web_client("xoxb-test", slack.api_url)
        client.edits = None
        surface = SlackSurface(client, "C1")
        ref = surface.post(Message.note("a"))
        surface.progress(MessageRef(ref.channel, ref.message_id), Message.note("b"))
        assert slack.messages("C1")[ref.message_id]["text"] == "b"
