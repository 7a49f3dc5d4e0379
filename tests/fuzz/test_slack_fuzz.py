"""Slack's side, fuzzed through the real path: signed HTTP requests to the bot's /slack/events
(Starlette, Bolt's adapter and listeners, kvpilot's chat core), with a local Slack-compatible
server for the Web API.

Slash-command text: unicode, huge, control characters, shell and Slack-markup injections,
flag-looking values, mentions, near-miss command names. Interactive payloads: malformed JSON,
missing and retyped fields, forged and swapped action values, other teams and channels, huge
values, replays. Users are an operator, an approver and a stranger, so the access checks run.

Properties: never a 5xx (a malformed signed payload gets a 4xx, not Bolt's 500); no error
logged (a traceback is not an answer); a refused command says why; and, checked against the
database at the end, never an experiment without an approval from an approver who did not
propose it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.db import open_db
from tests.bot.harness import CHANNEL, SlackDriver, running_bot
from tests.fuzz.conftest import scaled, tally
from tests.ports import free_port
from tests.slackfake import FakeSlack

SLACK = """[slack]
approvers = ["U2"]
operators = ["U1"]
channels = ["C0OPS"]
four_eyes = true
approval_ttl = "30m"
"""
USERS = st.sampled_from(["U1", "U2", "U9"])  # operator, approver, nobody
CHANNELS = st.sampled_from([CHANNEL, CHANNEL, "C0OTHER", "D0DIRECT"])
VERBS = ["help", "diagnose", "propose", "status", "abort", "approve", "reject", "history",
         "report", "tune", "diagnos", "DIAGNOSE", "aprove", "server", "serve", "rm"]  # fmt: skip
TOKENS = st.sampled_from(
    ["incident", "nosuch", "mem_fraction_static=0.9", "mem_fraction_static=0.99",
     "max_running_requests=-1", "kv_cache_dtype=fp8_e4m3", "hicache_size=48", "--force",
     "--since", "24h", "-1", "0", "1", "99999999999999999999", "--allow",
     "mem_fraction_static=0.80..0.95", "--max-experiments", "<@U2>", "<!channel>", "<#C0OPS>",
     "; rm -rf /", "$(reboot)", "`id`", "'", '"', "\\", "\x00", "\x1b[31m", "\u202e", "é",
     "*bold*", "```", "&lt;", "\n", "\t"]
)  # fmt: skip
TEXT = st.one_of(
    st.lists(st.sampled_from(VERBS) | TOKENS | st.text(max_size=12), max_size=6).map(" ".join),
    st.tuples(st.sampled_from(VERBS), st.lists(TOKENS, max_size=5)).map(
        lambda t: " ".join([t[0], *t[1]])
    ),
    st.text(max_size=200),
    st.sampled_from(["", " ", "x" * 20_000, "diagnose " + "a" * 5_000, "\x00" * 50]),
)
ACTIONS = st.sampled_from(
    ["kvpilot.approve", "kvpilot.reject", "kvpilot.propose", "kvpilot.rollout", "kvpilot.x",
     "kvpilot.approve#1", "other.approve", "", "kvpilot."]
)  # fmt: skip
ACTION_VALUES = st.one_of(
    st.integers(-5, 5).map(str),
    st.text(max_size=40),
    st.dictionaries(st.sampled_from(["proposal_id", "plan_hash", "server", "change"]),
                    st.integers(-2, 3) | st.text(max_size=10), max_size=4).map(json.dumps),
    st.just("x" * 10_000),
)  # fmt: skip


class Errors(logging.Handler):
    """Collects ERROR records of every logger while the fuzz runs."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class Pending:
    """An executor that counts what it was given and has not finished, so each input's
    answer, run after the HTTP response, is over before the next input is sent."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.count = 0
        self.cv = threading.Condition()

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        with self.cv:
            self.count += 1
        future = self.inner.submit(fn, *args, **kwargs)
        future.add_done_callback(self._done)
        return future

    def _done(self, _: Any) -> None:
        with self.cv:
            self.count -= 1
            self.cv.notify_all()

    def idle(self, timeout: float) -> bool:
        with self.cv:
            return self.cv.wait_for(lambda: self.count == 0, timeout)

    def shutdown(self, *args: Any, **kwargs: Any) -> None:
        self.inner.shutdown(*args, **kwargs)


class Harness:
    def __init__(self, bot: Any, driver: SlackDriver, errors: Errors) -> None:
        self.driver, self.errors = driver, errors
        runner = bot.app._listener_runner  # Bolt's listeners run here after the ack
        self.pools = [Pending(runner.listener_executor), Pending(bot.flow.work)]
        runner.listener_executor = runner.lazy_listener_runner.executor = self.pools[0]
        bot.flow.work = self.pools[1]

    def check(self, response: Any, what: str) -> None:
        assert response.status_code < 500, (what, response.status_code, response.text[:300])
        for pool in self.pools:  # the listener, then the work it submitted
            assert pool.idle(30), f"{what}: still running after 30 s"
        found = [r.getMessage() for r in self.errors.records]
        self.errors.records.clear()
        assert not found, (what, found)


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    from tests.bot.harness import twin_config  # noqa: PLC0415

    path = twin_config(tmp_path_factory.mktemp("slack-fuzz"), free_port(), slack=SLACK)
    errors = Errors()
    logging.getLogger().addHandler(errors)
    try:
        with FakeSlack() as slack, running_bot(path, slack) as (bot, driver):
            yield Harness(bot, driver, errors)
            bot.flow.runner.join(30)  # background answers finish before the checks below
    finally:
        logging.getLogger().removeHandler(errors)
    _no_change_without_approval(path.parent / "var" / "kvpilot.db")


def _no_change_without_approval(path: Path) -> None:
    """Every experiment (the only way kvpilot changes a server) traces to an approval by an
    approver of a proposal somebody else made."""
    db = open_db(path)
    for row in db.query("SELECT id, proposal_id FROM experiments"):
        approved = list(
            db.query(
                "SELECT a.actor, p.created_by FROM approvals a JOIN proposals p "
                "ON p.id = a.proposal_id WHERE a.proposal_id = ? AND a.decision = 'approved'",
                [row["proposal_id"]],
            )
        )
        assert approved, f"experiment {row['id']} without an approval"
        assert all(a["actor"] == "U2" and a["actor"] != a["created_by"] for a in approved)


@settings(max_examples=scaled(80, 10_000))
@given(text=TEXT, user=USERS, channel=CHANNELS)
def test_any_slash_command_is_answered(
    harness: Harness, text: str, user: str, channel: str
) -> None:
    tally("Slack: slash-command text")
    response = harness.driver.slash(text, user=user, channel=channel)
    harness.check(response, f"/kvpilot {text[:80]!r} by {user} in {channel}")
    assert response.status_code == 200
    if response.content:
        body = response.json()
        assert (body.get("text") or "").strip() or body.get("blocks"), body


@st.composite
def payload(draw: st.DrawFn) -> str:
    """A block_actions body with its fields dropped, retyped or forged, or not JSON at all."""
    shape = draw(st.sampled_from(["forged", "forged", "mutilated", "not json", "no payload"]))
    if shape == "not json":
        return "payload=" + quote(draw(st.text(max_size=80) | st.just('{"type": "block_acti')))
    if shape == "no payload":
        return draw(st.sampled_from(["", "payload=", "x=1", "payload=%ZZ", "payload=null"]))
    user, channel = draw(USERS), draw(CHANNELS)
    body: dict[str, Any] = {
        "type": draw(st.sampled_from(["block_actions", "block_actions", "view_submission", "x"])),
        "team": {"id": draw(st.sampled_from(["T1", "T2"])), "domain": "example"},
        "user": {"id": user, "username": user.lower(), "team_id": "T1"},
        "api_app_id": "A1",
        "token": "legacy",
        "container": {"type": "message", "message_ts": "1.2", "channel_id": channel},
        "trigger_id": "1.2.3",
        "channel": {"id": channel, "name": "ops"},
        "message": {"type": "message", "ts": draw(st.sampled_from(["1.2", "", "x"])), "text": ""},
        "response_url": "http://127.0.0.1:9/hook",
        "actions": [
            {
                "action_id": draw(ACTIONS),
                "block_id": "kvpilot-actions-0",
                "value": draw(ACTION_VALUES),
                "type": "button",
                "action_ts": str(time.time()),
            }
        ],
    }
    if shape == "mutilated":
        for _ in range(draw(st.integers(1, 3))):
            key = draw(st.sampled_from(sorted(body)))
            body[key] = draw(
                st.none() | st.integers() | st.text(max_size=8) | st.just([]) | st.just({})
            )
    return "payload=" + quote(json.dumps(body))


@settings(max_examples=scaled(80, 6_000))
@given(body=payload(), replay=st.booleans())
def test_any_button_payload_is_answered(harness: Harness, body: str, replay: bool) -> None:
    tally("Slack: interactive payloads")
    response = harness.driver.send(body, "application/x-www-form-urlencoded")
    harness.check(response, f"payload {body[:120]!r}")
    if replay:
        harness.check(harness.driver.replay(), "replayed payload")


@settings(max_examples=scaled(30, 3_000))
@given(
    body=st.text(max_size=200) | st.just(urlencode({"command": "/kvpilot", "text": "help"})),
    signed=st.booleans(),
    age_s=st.sampled_from([0, 0, 299, 301, 3600, -3600]),
    ctype=st.sampled_from(["application/x-www-form-urlencoded", "application/json", "text/plain"]),
)
def test_any_request_body_is_answered_or_refused(
    harness: Harness, body: str, signed: bool, age_s: int, ctype: str
) -> None:
    tally("Slack: raw request bodies and signatures")
    response = harness.driver.send(body, ctype, signed=signed, age_s=age_s)
    harness.check(response, f"{ctype} {body[:80]!r} signed={signed} age={age_s}")
    if not signed or abs(age_s) > 300:
        assert response.status_code == 401


@pytest.mark.parametrize(
    ("body", "signed", "status", "says"),
    [
        ("payload=" + quote('{"type": "block_acti'), True, 400, "the payload is not JSON"),
        ("payload=" + quote('{"type": "block_acti'), False, 401, "invalid request signature"),
        ("payload=" + quote(json.dumps({"type": "block_actions", "team": None})), True, 400,
         "`team` is null, not an object"),
        ("payload=" + quote(json.dumps({"type": "block_actions", "user": "U1"})), True, 400,
         "`user` is a JSON str, not an object"),
        ("payload=" + quote(json.dumps({"type": "block_actions", "actions": [1]})), True, 400,
         "`actions` is not a list of objects"),
        ("payload=null", True, 400, "a JSON NoneType, not an object"),
        ("payload=" + quote(json.dumps({"type": "block_actions", "actions": []})), True, 400,
         "`actions` is empty"),
        ("payload=" + quote(json.dumps({"type": "block_actions", "actions": [{"action_id": 7}]})),
         True, 400, "an action's `action_id` is a JSON int, not a string"),
        ("payload=" + quote("[1, 2]"), True, 400, "a JSON list, not an object"),
    ],
)  # fmt: skip
def test_a_malformed_signed_request_is_a_400_naming_the_problem(
    harness: Harness, body: str, signed: bool, status: int, says: str
) -> None:
    """Found by the fuzz above: Bolt answered these with a 500 and a traceback."""
    response = harness.driver.send(body, "application/x-www-form-urlencoded", signed=signed)
    assert response.status_code == status
    assert says in response.json()["error"]
