"""The local Slack server answers slack_sdk, slack_bolt and Socket Mode the way Slack does."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from slack_bolt import App, BoltRequest
from slack_bolt.adapter.socket_mode import SocketModeHandler
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_handlers import RateLimitErrorRetryHandler
from slack_sdk.signature import SignatureVerifier
from slack_sdk.webhook import WebhookClient

from tests.slackfake import BOT_USER_ID, FakeSlack
from tests.slackfake.state import DEFAULT_SCOPES

SECRET = "test-signing-secret"


@pytest.fixture(autouse=True)
def _no_slack_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """SLACK_* variables would switch Bolt into OAuth or other modes."""
    for name in list(os.environ):
        if name.startswith("SLACK_"):
            monkeypatch.delenv(name)


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    scopes = (*DEFAULT_SCOPES, "im:write", "users:read")
    with FakeSlack(usergroups={"S0APPROVERS": ["U1", "U2"]}, scopes=scopes) as fake:
        yield fake


def client(slack: FakeSlack, token: str = "xoxb-test") -> WebClient:
    return WebClient(token=token, base_url=slack.api_url, timeout=5)


def png_bytes(width: int = 4, height: int = 3) -> bytes:
    """A real (tiny, grey) PNG: signature, IHDR, IDAT, IEND with CRCs."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    rows = b"".join(b"\x00" + bytes([128]) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def buttons(*action_ids: str, block_id: str = "decide") -> dict[str, Any]:
    return {
        "type": "actions",
        "block_id": block_id,
        "elements": [
            {
                "type": "button",
                "action_id": a,
                "text": {"type": "plain_text", "text": a},
                "value": a,
            }
            for a in action_ids
        ],
    }


def section(text: str, block_id: str | None = None) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "section", "text": {"type": "mrkdwn", "text": text}}
    if block_id:
        block["block_id"] = block_id
    return block


def signed_request(body: str) -> BoltRequest:
    ts = str(int(time.time()))
    signature = SignatureVerifier(SECRET).generate_signature(timestamp=ts, body=body)
    assert signature is not None
    headers: dict[str, str | Sequence[str]] = {
        "content-type": ["application/x-www-form-urlencoded"],
        "x-slack-signature": [signature],
        "x-slack-request-timestamp": [ts],
    }
    return BoltRequest(body=body, headers=headers)


# -- Web API -----------------------------------------------------------------------------------


def test_auth_test_identity_and_scopes(slack: FakeSlack) -> None:
    response = client(slack).auth_test()
    assert response["user_id"] == BOT_USER_ID
    assert response["team_id"] == "T1"
    assert response["bot_id"] and response["url"]
    assert "chat:write" in response.headers["x-oauth-scopes"]
    call = slack.calls("auth.test")[0]
    assert call.headers["authorization"] == "Bearer xoxb-test"
    assert slack.violations == []


def test_membership_and_scopes_decide_where_the_bot_may_post() -> None:
    """As Slack: a bot posts only where it is a member (chat:write.public adds public
    channels), a private channel is invisible to non-members, and a call outside the token's
    scopes is `missing_scope` with what was needed."""
    with FakeSlack(outside=("C0OTHER", "G0SECRET"), private=("G0SECRET",)) as fake:
        web = client(fake)
        assert web.conversations_info(channel="C0OPS")["channel"]["is_member"] is True
        assert web.conversations_info(channel="C0OTHER")["channel"]["is_member"] is False
        for channel, error in (("C0OTHER", "not_in_channel"), ("G0SECRET", "channel_not_found")):
            with pytest.raises(SlackApiError) as raised:
                web.chat_postMessage(channel=channel, text="hello")
            assert raised.value.response["error"] == error
        with pytest.raises(SlackApiError) as raised:
            web.conversations_info(channel="G0SECRET")
        assert raised.value.response["error"] == "channel_not_found"
    with FakeSlack(outside=("C0OTHER",), scopes=("chat:write", "chat:write.public")) as fake:
        web = client(fake)
        assert web.chat_postMessage(channel="C0OTHER", text="hello")["ok"]
        with pytest.raises(SlackApiError) as raised:
            web.conversations_info(channel="C0OTHER")
        assert raised.value.response["error"] == "missing_scope"
        assert raised.value.response["needed"] == "channels:read"
        assert raised.value.response.headers["x-oauth-scopes"] == "chat:write,chat:write.public"


@pytest.mark.parametrize("token", ["xapp-1-test", "bogus", ""])
def test_web_api_needs_a_bot_token(slack: FakeSlack, token: str) -> None:
    with pytest.raises(SlackApiError) as raised:
        WebClient(token=token or None, base_url=slack.api_url, timeout=5).auth_test()
    assert raised.value.response["error"] == "invalid_auth"


def test_connections_open_needs_an_app_token(slack: FakeSlack) -> None:
    with pytest.raises(SlackApiError) as raised:
        client(slack).apps_connections_open(app_token="xoxb-test")
    assert raised.value.response["error"] == "invalid_auth"
    response = client(slack).apps_connections_open(app_token="xapp-1-test")
    assert response["url"] == slack.socket_url
    assert slack.socket_url.startswith("ws://127.0.0.1:") and slack.socket_url.endswith("/link")


def test_unknown_method_is_a_violation(slack: FakeSlack) -> None:
    with pytest.raises(SlackApiError) as raised:
        client(slack).api_call("chat.postMesage", json={"channel": "C1", "text": "typo"})
    assert raised.value.response["error"] == "unknown_method"
    assert slack.violations and "chat.postMesage" in slack.violations[0]


def test_post_thread_and_update_keep_channel_state(slack: FakeSlack) -> None:
    web = client(slack)
    parent = web.chat_postMessage(
        channel="C1", text="approve?", blocks=[section("Restart?"), buttons("approve", "deny")]
    )
    assert parent["channel"] == "C1"
    assert parent["message"]["text"] == "approve?"
    reply = web.chat_postMessage(channel="C1", text="step 1", thread_ts=parent["ts"])
    assert float(reply["ts"]) > float(parent["ts"])
    updated = web.chat_update(channel="C1", ts=parent["ts"], text="approved", blocks=[])
    assert updated["ts"] == parent["ts"]

    messages = slack.messages("C1")
    assert list(messages) == [parent["ts"], reply["ts"]]
    assert messages[parent["ts"]]["text"] == "approved"
    assert "blocks" not in messages[parent["ts"]]
    assert messages[parent["ts"]]["edited"]["user"] == BOT_USER_ID
    assert messages[reply["ts"]]["thread_ts"] == parent["ts"]
    assert messages[reply["ts"]]["user"] == BOT_USER_ID
    assert (
        slack.calls("chat.postMessage")[0].params["blocks"][1]["elements"][0]["value"] == "approve"
    )
    assert slack.violations == []


def test_update_refuses_people_messages_and_unknown_ts(slack: FakeSlack) -> None:
    web = client(slack)
    ts = slack.post_user_message("C1", "hello", user="U1")
    with pytest.raises(SlackApiError) as raised:
        web.chat_update(channel="C1", ts=ts, text="edited by the bot")
    assert raised.value.response["error"] == "cant_update_message"
    assert slack.messages("C1")[ts]["text"] == "hello"
    with pytest.raises(SlackApiError) as raised:
        web.chat_update(channel="C1", ts="1.000001", text="gone")
    assert raised.value.response["error"] == "message_not_found"
    assert len(slack.violations) == 1  # only the edit of someone else's message broke a rule


@pytest.mark.filterwarnings("ignore:The top-level `text` argument is missing")
def test_post_message_needs_channel_and_content(slack: FakeSlack) -> None:
    web = client(slack)
    with pytest.raises(SlackApiError) as raised:
        web.api_call("chat.postMessage", json={"text": "where to?"})
    assert raised.value.response["error"] == "channel_not_found"
    with pytest.raises(SlackApiError) as raised:
        web.chat_postMessage(channel="C1")
    assert raised.value.response["error"] == "no_text"
    assert len(slack.violations) == 2
    assert slack.messages("C1") == {}


def test_ephemeral_schedule_dm_users_and_groups(slack: FakeSlack) -> None:
    web = client(slack)
    ephemeral = web.chat_postEphemeral(channel="C1", user="U1", text="only you")
    assert ephemeral["message_ts"]
    assert slack.ephemerals("C1")[0]["to_user"] == "U1"
    assert slack.messages("C1") == {}

    post_at = int(time.time()) + 3600
    scheduled = web.chat_scheduleMessage(channel="C1", post_at=post_at, text="daily report")
    assert scheduled["post_at"] == post_at and scheduled["scheduled_message_id"].startswith("Q")
    assert slack.scheduled()[0]["text"] == "daily report"
    with pytest.raises(SlackApiError) as raised:
        web.chat_scheduleMessage(channel="C1", post_at=int(time.time()) - 5, text="late")
    assert raised.value.response["error"] == "time_in_past"

    dm = web.conversations_open(users="U1")
    assert dm["channel"]["id"].startswith("D")
    assert web.conversations_open(users=["U1"])["channel"]["id"] == dm["channel"]["id"]

    user = web.users_info(user="U2")["user"]
    assert user["id"] == "U2" and user["tz"] == "UTC"
    assert slack.calls("users.info")[0].params == {"user": "U2"}  # sent as a GET query
    assert web.usergroups_users_list(usergroup="S0APPROVERS")["users"] == ["U1", "U2"]
    with pytest.raises(SlackApiError) as raised:
        web.usergroups_users_list(usergroup="S0NOPE")
    assert raised.value.response["error"] == "no_such_subteam"
    assert len(slack.violations) == 1 and "is in the past" in slack.violations[0]


def test_files_upload_v2_three_steps(slack: FakeSlack) -> None:
    web = client(slack)
    parent = web.chat_postMessage(channel="C1", text="report")
    image = png_bytes()
    response = web.files_upload_v2(
        channel="C1",
        file=image,
        filename="ttft.png",
        title="TTFT p95",
        initial_comment="today's chart",
        thread_ts=parent["ts"],
    )
    assert response["file"]["name"] == "ttft.png"
    assert response["file"]["mimetype"] == "image/png"
    assert [c.method for c in slack.calls()][-3:] == [
        "files.getUploadURLExternal",
        "upload",
        "files.completeUploadExternal",
    ]
    assert slack.calls("files.getUploadURLExternal")[0].params["length"] == str(len(image))
    (shared,) = slack.files
    assert shared.content == image and shared.content.startswith(b"\x89PNG")
    assert (shared.filename, shared.title, shared.channel) == ("ttft.png", "TTFT p95", "C1")
    assert (shared.thread_ts, shared.initial_comment) == (parent["ts"], "today's chart")
    assert slack.violations == []


def test_upload_with_wrong_length_is_refused(slack: FakeSlack) -> None:
    issued = client(slack).files_getUploadURLExternal(filename="a.png", length=10)
    request = urllib.request.Request(issued["upload_url"], data=b"short", method="POST")
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=5)
    assert raised.value.code == 400
    assert "declared 10 bytes but 5 arrived" in slack.violations[0]
    with pytest.raises(SlackApiError) as completed:
        client(slack).files_completeUploadExternal(
            files=[{"id": issued["file_id"]}], channel_id="C1"
        )
    assert completed.value.response["error"] == "file_not_found"
    assert slack.files == []


# -- Block Kit ---------------------------------------------------------------------------------

BAD_MESSAGES = {
    "51 blocks": ([section(f"row {i}") for i in range(51)], "51 blocks"),
    "3001-char section": ([section("x" * 3001)], "3000"),
    "duplicate action_ids": ([buttons("approve", "approve")], "action_id 'approve'"),
    "duplicate block_ids": ([section("a", "same"), section("b", "same")], "block_id 'same'"),
    "unknown block type": ([{"type": "sparkline", "points": [1, 2]}], "unknown block type"),
    "unknown key": ([{"type": "divider", "colour": "red"}], "unknown keys"),
    "bad button style": (
        [
            {
                "type": "actions",
                "elements": [
                    {
                        "type": "button",
                        "action_id": "go",
                        "style": "green",
                        "text": {"type": "plain_text", "text": "Go"},
                    }
                ],
            }
        ],
        "style",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_MESSAGES))
def test_bad_blocks_are_rejected(slack: FakeSlack, case: str) -> None:
    blocks, reason = BAD_MESSAGES[case]
    with pytest.raises(SlackApiError) as raised:
        client(slack).chat_postMessage(channel="C1", text="fallback", blocks=blocks)
    assert raised.value.response["error"] == "invalid_blocks"
    assert len(slack.violations) == 1 and reason in slack.violations[0], slack.violations
    assert slack.messages("C1") == {}


@pytest.mark.filterwarnings("ignore:The top-level `text` argument is missing")
def test_blocks_need_fallback_text_and_are_checked_on_update(slack: FakeSlack) -> None:
    web = client(slack)
    with pytest.raises(SlackApiError):
        web.chat_postMessage(channel="C1", blocks=[section("no fallback")])
    assert "fallback" in slack.violations[0]
    ok = web.chat_postMessage(channel="C1", text="x", blocks=[section("fine"), buttons("a", "b")])
    with pytest.raises(SlackApiError) as raised:
        web.chat_update(channel="C1", ts=ok["ts"], text="x", blocks=[section("y" * 3001)])
    assert raised.value.response["error"] == "invalid_blocks"
    assert slack.messages("C1")[ok["ts"]]["blocks"][0]["text"]["text"] == "fine"
    form = web.api_call(
        "chat.postMessage",
        data={"channel": "C1", "text": "form", "blocks": json.dumps([section("as form")])},
    )
    assert slack.messages("C1")[form["ts"]]["blocks"][0]["text"]["text"] == "as form"
    assert len(slack.violations) == 2


# -- faults --------------------------------------------------------------------------------------


def test_fail_next_error_applies_once(slack: FakeSlack) -> None:
    slack.fail_next("chat.postMessage", error="not_in_channel")
    web = client(slack)
    with pytest.raises(SlackApiError) as raised:
        web.chat_postMessage(channel="C1", text="a")
    assert raised.value.response["error"] == "not_in_channel"
    assert web.chat_postMessage(channel="C1", text="b")["ok"]
    assert slack.violations == []
    with pytest.raises(ValueError, match="whole seconds"):
        slack.fail_next("chat.update", status=429, retry_after=0.5)  # type: ignore[arg-type]


def test_429_without_retry_handler_raises(slack: FakeSlack) -> None:
    slack.fail_next("chat.update", status=429, retry_after=1)
    web = client(slack)
    posted = web.chat_postMessage(channel="C1", text="progress 0%")
    with pytest.raises(SlackApiError) as raised:
        web.chat_update(channel="C1", ts=posted["ts"], text="progress 50%")
    assert raised.value.response.status_code == 429
    assert raised.value.response.headers["Retry-After"] == "1"
    assert len(slack.calls("chat.update")) == 1


def test_429_with_retry_handler_waits_and_succeeds(slack: FakeSlack) -> None:
    slack.fail_next("chat.update", status=429, retry_after=1)
    web = client(slack)
    web.retry_handlers.append(RateLimitErrorRetryHandler(max_retry_count=1))
    posted = web.chat_postMessage(channel="C1", text="progress 0%")
    started = time.monotonic()
    assert web.chat_update(channel="C1", ts=posted["ts"], text="progress 50%")["ok"]
    first, second = slack.wait_for("chat.update", count=2)
    assert second.at - first.at >= 1.0
    assert time.monotonic() - started >= 1.0
    assert slack.messages("C1")[posted["ts"]]["text"] == "progress 50%"


def test_wait_for_reports_what_was_seen(slack: FakeSlack) -> None:
    client(slack).auth_test()
    with pytest.raises(AssertionError, match=r"expected 1 chat.update.*'auth.test'"):
        slack.wait_for("chat.update", timeout=0.05)


# -- response_url ------------------------------------------------------------------------------


def test_response_url_replace_and_delete_original(slack: FakeSlack) -> None:
    web = client(slack)
    posted = web.chat_postMessage(
        channel="C1", text="approve?", blocks=[buttons("approve", "deny")]
    )
    hook = WebhookClient(slack.response_url("click", channel="C1", message_ts=posted["ts"]))
    assert hook.send(text="approved by <@U1>", replace_original=True).status_code == 200
    message = slack.messages("C1")[posted["ts"]]
    assert message["text"] == "approved by <@U1>" and "blocks" not in message
    assert slack.hooks("click")[0]["replace_original"] is True
    assert hook.send(text="x", blocks=[buttons("a", "a")]).body == "invalid_blocks"
    assert hook.send(delete_original=True).status_code == 200
    assert posted["ts"] not in slack.messages("C1")
    assert len(slack.hooks("click")) == 2
    assert len(slack.violations) == 1


def test_response_url_accepts_five_posts(slack: FakeSlack) -> None:
    hook = WebhookClient(slack.response_url("cmd"))
    statuses = [hook.send(text=f"reply {i}").status_code for i in range(6)]
    assert statuses == [200] * 5 + [404]
    assert "more than 5 posts" in slack.violations[0]


def test_malformed_requests_get_clear_errors(slack: FakeSlack) -> None:
    def post(path: str, data: bytes, content_type: str) -> tuple[int, bytes]:
        request = urllib.request.Request(
            slack.api_url.replace("/api/", path),
            data=data,
            headers={"Content-Type": content_type, "Authorization": "Bearer xoxb-test"},
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    assert post("/hooks/h", b"{not json", "application/json") == (400, b"invalid_payload")
    status, body = post("/api/chat.postMessage", b"[1]", "application/json")
    assert (status, json.loads(body)) == (200, {"ok": False, "error": "invalid_json"})
    assert post("/elsewhere", b"x", "text/plain")[0] == 404
    assert len(slack.violations) == 3
    assert "could not be parsed" in slack.violations[0]
    assert "no such endpoint" in slack.violations[2]
    assert [call.method for call in slack.calls()] == ["hooks/h", "chat.postMessage", "/elsewhere"]


# -- Bolt over HTTP -----------------------------------------------------------------------------


def test_signed_slash_command_through_bolt(slack: FakeSlack) -> None:
    app = App(client=client(slack), signing_secret=SECRET)

    @app.command("/kv")
    def handle(ack: Any, say: Any, respond: Any, command: dict[str, Any]) -> None:
        ack("working on it")
        say(text=f"status of {command['text']}", blocks=[section("*all good*")])
        respond(text="done", response_type="ephemeral")

    body = urlencode(
        {
            "command": "/kv",
            "text": "twin",
            "user_id": "U1",
            "channel_id": "C9",
            "team_id": "T1",
            "trigger_id": "1.2.abc",
            "response_url": slack.response_url("cmd-1"),
        }
    )
    response = app.dispatch(signed_request(body))
    assert (response.status, response.body) == (200, "working on it")
    slack.wait_for("hooks/cmd-1")
    (posted,) = slack.wait_for("chat.postMessage")
    assert posted.params["channel"] == "C9"
    assert [m["text"] for m in slack.messages("C9").values()] == ["status of twin"]
    assert slack.hooks("cmd-1")[0]["text"] == "done"
    assert len(slack.calls("auth.test")) == 1
    bad = signed_request(body)
    bad.headers["x-slack-signature"] = ["v0=" + hashlib.sha256(b"forged").hexdigest()]
    assert app.dispatch(bad).status == 401
    assert slack.violations == []


def test_button_click_through_bolt_updates_the_message(slack: FakeSlack) -> None:
    app = App(client=client(slack), signing_secret=SECRET, process_before_response=True)
    posted = app.client.chat_postMessage(
        channel="C1", text="approve?", blocks=[buttons("approve", "deny")]
    )

    @app.action("approve")
    def approve(ack: Any, body: dict[str, Any], client: WebClient) -> None:
        ack()
        client.chat_update(
            channel=body["channel"]["id"],
            ts=body["message"]["ts"],
            text=f"approved by <@{body['user']['id']}>",
            blocks=[],
        )

    payload = {
        "type": "block_actions",
        "user": {"id": "U2"},
        "team": {"id": "T1"},
        "channel": {"id": "C1"},
        "message": {"ts": posted["ts"], "text": "approve?"},
        "container": {"type": "message", "message_ts": posted["ts"], "channel_id": "C1"},
        "response_url": slack.response_url("click", channel="C1", message_ts=posted["ts"]),
        "trigger_id": "1.2.abc",
        "actions": [{"action_id": "approve", "block_id": "decide", "value": "approve"}],
    }
    response = app.dispatch(signed_request("payload=" + quote(json.dumps(payload))))
    assert response.status == 200
    assert slack.messages("C1")[posted["ts"]]["text"] == "approved by <@U2>"
    assert slack.violations == []


# -- Socket Mode ---------------------------------------------------------------------------------


def test_socket_mode_end_to_end_with_reconnect(slack: FakeSlack) -> None:
    app = App(client=client(slack))

    @app.command("/kv")
    def handle(ack: Any, say: Any, command: dict[str, Any]) -> None:
        ack(text=f"on it: {command['text']}")
        say(text="socket reply")

    handler = SocketModeHandler(app, "xapp-1-test")
    try:
        handler.connect()  # type: ignore[no-untyped-call]
        command = {"command": "/kv", "text": "status", "user_id": "U1", "channel_id": "C1"}
        env_id = slack.socket_send("slash_commands", command)
        ack = slack.socket_wait_ack(env_id)
        assert ack == {"envelope_id": env_id, "payload": {"text": "on it: status"}}
        slack.wait_for("chat.postMessage")
        assert slack.calls("apps.connections.open")[0].headers["authorization"] == (
            "Bearer xapp-1-test"
        )

        assert slack.socket_disconnect() == 1
        slack.socket_wait_connections(2)
        second = slack.socket_send("slash_commands", {**command, "text": "again"})
        assert slack.socket_wait_ack(second)["payload"] == {"text": "on it: again"}
        assert len(slack.calls("apps.connections.open")) == 2
    finally:
        handler.close()  # type: ignore[no-untyped-call]
    assert [m["text"] for m in slack.messages("C1").values()] == ["socket reply", "socket reply"]
    assert slack.violations == []


def test_socket_mode_threads_end_with_the_server() -> None:
    before = set(threading.enumerate())
    with FakeSlack() as slack:
        app = App(client=client(slack))
        handler = SocketModeHandler(app, "xapp-1-test")
        handler.connect()  # type: ignore[no-untyped-call]
        slack.socket_wait_connections(1)
        handler.close()  # type: ignore[no-untyped-call]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and set(threading.enumerate()) - before:
        time.sleep(0.02)
    assert set(threading.enumerate()) - before == set()


def test_socket_send_without_client_explains(slack: FakeSlack) -> None:
    with pytest.raises(AssertionError, match="no Socket Mode client connected"):
        slack.socket_send("slash_commands", {"command": "/kv"}, timeout=0.05)
    with pytest.raises(AssertionError, match="no ack for envelope 'env-x'"):
        slack.socket_wait_ack("env-x", timeout=0.05)


def _section(i: int) -> dict[str, Any]:
    return {"type": "section", "block_id": f"b{i}", "text": {"type": "mrkdwn", "text": f"{i}"}}


def test_views_publish_keeps_a_home_view_within_slacks_rules(slack: FakeSlack) -> None:
    web = WebClient(token="xoxb-test", base_url=slack.api_url, timeout=5)
    web.views_publish(
        user_id="U7", view={"type": "home", "blocks": [_section(i) for i in range(100)]}
    )
    home = slack.home("U7")
    assert home is not None and len(home["blocks"]) == 100
    bad: list[tuple[dict[str, Any], str]] = [
        ({"type": "modal", "blocks": []}, "invalid_arguments"),
        ({"type": "home", "blocks": [_section(i) for i in range(101)]}, "invalid_blocks"),
        ({"type": "home", "blocks": [_section(1), _section(1)]}, "invalid_blocks"),
        ({"type": "home", "blocks": [], "title": "x"}, "invalid_arguments"),
    ]
    for view, error in bad:
        with pytest.raises(SlackApiError) as caught:
            web.views_publish(user_id="U7", view=view)
        assert caught.value.response["error"] == error
    with pytest.raises(SlackApiError) as caught:
        web.views_publish(user_id="bob", view={"type": "home", "blocks": []})
    assert caught.value.response["error"] == "invalid_arguments"
    assert len(slack.violations) == 5
