"""Messages into one channel at Slack's pace: a burst, then one a second; other channels free."""

from __future__ import annotations

import threading

import pytest

from bot.slack.pacing import BURST, EDITS_BURST, EDITS_PER_S, PER_S, ChannelPacer
from bot.slack.surface import CountingWebClient, web_client
from tests.slackfake import FakeSlack


class Manual:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


@pytest.mark.parametrize(
    ("posts", "delays"),
    [
        # (time, channel) -> seconds each post waits; one a second after a burst of three
        ([(0, "C1")] * 5, [0, 0, 0, 1, 2]),
        ([(0, "C1"), (0, "C1"), (0, "C1"), (0, "C2"), (0, "C1")], [0, 0, 0, 0, 1]),
        ([(0, "C1"), (0.5, "C1"), (1, "C1"), (1.5, "C1"), (2, "C1")], [0, 0, 0, 0, 0]),
        ([(0, "C1")] * 4 + [(10, "C1")] * 3, [0, 0, 0, 1, 0, 0, 0]),  # the bucket refills
        ([(0, "C1")] * 6 + [(1, "C1")], [0, 0, 0, 1, 2, 3, 3]),  # turns are kept in order
    ],
)
def test_a_burst_then_one_a_second(posts: list[tuple[float, str]], delays: list[float]) -> None:
    t = Manual()
    pacer = ChannelPacer(per_s=1.0, burst=3, clock=t.clock, sleep=t.sleep)
    got = []
    for at, channel in posts:
        t.now = 100.0 + at
        got.append(pacer.delay(channel))
    assert got == pytest.approx(delays)


@pytest.mark.parametrize(
    ("per_s", "burst", "most"),
    [(PER_S, BURST, 60 * PER_S + BURST - 1), (EDITS_PER_S, EDITS_BURST, 49)],
    ids=["posts into a channel", "edits in the workspace: under Tier 3's 50"],
)
def test_no_minute_ever_takes_more_than_the_rate_and_one_burst(
    per_s: float, burst: int, most: float
) -> None:
    t = Manual()
    pacer = ChannelPacer(per_s, burst, clock=t.clock, sleep=t.sleep)
    sent = []
    for i in range(600):  # ten calls a second wanted for a minute
        t.now = 100.0 + i / 10
        sent.append(t.now + pacer.delay("C1"))
    for start in sent:
        in_a_minute = sum(1 for s in sent if start <= s < start + 60)
        assert in_a_minute <= most


@pytest.mark.parametrize(("per_s", "burst"), [(0, 3), (-1, 3), (1, 0)])
def test_a_pace_that_sends_nothing_is_refused(per_s: float, burst: int) -> None:
    with pytest.raises(ValueError, match="sends nothing"):
        ChannelPacer(per_s, burst)


def test_the_bots_client_paces_its_posts_per_channel(slack: FakeSlack) -> None:
    """The bot's client asks the pacer before each post, channel by channel. Judged by the
    waits the pacer hands out on a clock of the test's (when the posts reached the local Slack
    server says as much about the machine's load as about the pacing)."""
    client = web_client("xoxb-test", slack.api_url)
    assert isinstance(client, CountingWebClient) and client.pacer is not None
    t = Manual()
    client.pacer = ChannelPacer(per_s=20.0, burst=2, clock=t.clock, sleep=t.sleep)
    for _ in range(6):  # all at once: a burst of two, then one every 1/20 s
        client.chat_postMessage(channel="C1", text="x")
    assert t.slept == pytest.approx([0.05, 0.10, 0.15, 0.20])
    for _ in range(2):
        client.chat_postMessage(channel="C2", text="x")
    assert len(t.slept) == 4, "C2 was held up behind C1's queue"
    sent = [c.params["channel"] for c in slack.calls("chat.postMessage")]
    assert sent == ["C1"] * 6 + ["C2"] * 2
    for _ in range(3):
        client.chat_postEphemeral(channel="C1", user="U1", text="y")
    assert len(t.slept) == 4, "a whisper is not a post: not paced"


def test_a_post_waiting_its_turn_holds_up_no_other_channel(slack: FakeSlack) -> None:
    """The turn is taken under the pacer's lock and slept outside it: a post into another
    channel goes while one into C1 still waits."""
    client = web_client("xoxb-test", slack.api_url)
    waiting, release = threading.Event(), threading.Event()

    def held(seconds: float) -> None:
        waiting.set()
        assert release.wait(10)

    client.pacer = ChannelPacer(per_s=1.0, burst=1, sleep=held)
    client.chat_postMessage(channel="C1", text="first")
    second = threading.Thread(target=client.chat_postMessage, kwargs={"channel": "C1", "text": "x"})
    second.start()
    try:
        assert waiting.wait(10)
        client.chat_postMessage(channel="C2", text="y")  # returns while C1's second waits
        assert second.is_alive()
        assert [c.params["channel"] for c in slack.calls("chat.postMessage")] == ["C1", "C2"]
    finally:
        release.set()
        second.join(10)
    assert len(slack.calls("chat.postMessage")) == 3


def test_edits_are_paced_for_the_whole_workspace(slack: FakeSlack) -> None:
    client = web_client("xoxb-test", slack.api_url)
    assert isinstance(client, CountingWebClient) and client.edit_pacer is not None
    assert client.edit_pacer.interval_s == pytest.approx(60 / 45)  # under Tier 3's 50 a minute
    posted = [client.chat_postMessage(channel=c, text="x") for c in ("C1", "C2", "C3")]
    t = Manual()
    client.edit_pacer = ChannelPacer(per_s=1.0, burst=2, clock=t.clock, sleep=t.sleep)
    for response in posted:  # three channels, one workspace: the third edit waits
        client.chat_update(channel=response["channel"], ts=response["ts"], text="y")
    assert t.slept == [pytest.approx(1.0)]
