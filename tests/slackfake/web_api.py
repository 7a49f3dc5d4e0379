"""The Web API methods the bot uses, with Slack's argument rules and error codes.

Each method takes the shared state and the parsed parameters and returns the JSON answer, or
raises ``ApiError``. Errors caused by a malformed request carry a violation text (the bot broke
the contract); errors that depend on workspace state (unknown user group, deleted message) do
not, because a good bot may meet them.
"""

from __future__ import annotations

import copy
import json
import mimetypes
import re
import time
from collections.abc import Callable
from typing import Any

from tests.slackfake.blocks import MAX_BLOCKS_PER_VIEW, block_problems, decode_blocks
from tests.slackfake.state import (
    APP_ID,
    BOT_ID,
    BOT_USER_ID,
    TEAM_ID,
    ApiError,
    HookTarget,
    PendingUpload,
    SlackState,
    UploadedFile,
    manifest_home_tab,
)

# The scope each method needs of a bot token (Slack's method pages, "Required scopes");
# conversations.info needs channels:read for a public channel, groups:read for a private one.
NEEDS = {
    "chat.postMessage": "chat:write",
    "chat.update": "chat:write",
    "chat.postEphemeral": "chat:write",
    "chat.scheduleMessage": "chat:write",
    "conversations.open": "im:write",
    "users.info": "users:read",
    "usergroups.users.list": "usergroups:read",
    "files.getUploadURLExternal": "files:write",
    "files.completeUploadExternal": "files:write",
}
MAX_SCHEDULE_AHEAD_S = 120 * 24 * 3600
MAX_HOOK_POSTS = 5
USER_ID = re.compile(r"^[UW][A-Z0-9]+$")

Method = Callable[[SlackState, dict[str, Any]], dict[str, Any]]


def _required(
    method: str, params: dict[str, Any], name: str, error: str = "invalid_arguments"
) -> str:
    value = params.get(name)
    if value is None or value == "":
        raise ApiError(error, f"{method}: missing required argument '{name}'")
    return str(value)


def _content(
    method: str, params: dict[str, Any], *, need_content: bool = True
) -> tuple[str | None, list[Any] | None]:
    """Validate text/blocks of a message-carrying call; return (text, blocks)."""
    blocks, problem = decode_blocks(params.get("blocks"))
    if problem:
        raise ApiError("invalid_blocks", f"{method}: {problem}")
    text = params.get("text")
    if text is not None and not isinstance(text, str):
        raise ApiError("invalid_arguments", f"{method}: text must be a string")
    if blocks is not None:
        problems = block_problems(blocks, text)
        if problems:
            raise ApiError("invalid_blocks", f"{method}: " + "; ".join(problems))
    if need_content and not text and not blocks and not params.get("attachments"):
        raise ApiError("no_text", f"{method}: neither 'text' nor 'blocks' given")
    return text, blocks


def _message(
    state: SlackState, text: str | None, blocks: list[Any] | None, **extra: Any
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "type": "message",
        "ts": state.next_ts(),
        "user": BOT_USER_ID,
        "bot_id": BOT_ID,
        "app_id": APP_ID,
        "team": TEAM_ID,
        "text": text or "",
    }
    if blocks is not None:
        message["blocks"] = blocks
    message.update({key: value for key, value in extra.items() if value not in (None, "")})
    return message


def auth_test(state: SlackState, params: dict[str, Any]) -> dict[str, Any]:
    return {
        "ok": True,
        "url": "https://fake-workspace.slack.com/",
        "team": "Fake Workspace",
        "user": "kvpilot",
        "team_id": TEAM_ID,
        "user_id": BOT_USER_ID,
        "bot_id": BOT_ID,
        "is_enterprise_install": False,
    }


def need_scope(state: SlackState, scope: str) -> None:
    """Slack's answer to a call the token's scopes do not cover."""
    if scope not in state.scopes:
        raise ApiError("missing_scope", extra={"needed": scope, "provided": ",".join(state.scopes)})


def can_post(state: SlackState, channel: str) -> None:
    """A bot posts where it is a member; `chat:write.public` adds the public channels."""
    if channel not in state.outside:
        return
    if channel in state.private:
        raise ApiError("channel_not_found")
    if "chat:write.public" not in state.scopes:
        raise ApiError("not_in_channel")


def conversations_info(state: SlackState, params: dict[str, Any]) -> dict[str, Any]:
    channel = _required("conversations.info", params, "channel", "channel_not_found")
    private = channel in state.private
    need_scope(state, "groups:read" if private else "channels:read")
    member = channel not in state.outside
    if private and not member:
        raise ApiError("channel_not_found")  # a private channel is invisible to non-members
    info = {
        "id": channel,
        "name": channel.lower(),
        "is_channel": True,
        "is_private": private,
        "is_archived": False,
        "is_member": member,
    }
    return {"ok": True, "channel": info}


def chat_post_message(state: SlackState, params: dict[str, Any]) -> dict[str, Any]:
    channel = _required("chat.postMessage", params, "channel", "channel_not_found")
    can_post(state, channel)
    text, blocks = _content("chat.postMessage", params)
    message = _message(
        state,
        text,
        blocks,
        thread_ts=params.get("thread_ts"),
        reply_broadcast=params.get("reply_broadcast"),
        metadata=params.get("metadata"),
    )
    state.channel(channel)[message["ts"]] = message
    return {"ok": True, "channel": channel, "ts": message["ts"], "message": copy.deepcopy(message)}


def chat_update(state: SlackState, params: dict[str, Any]) -> dict[str, Any]:
    channel = _required("chat.update", params, "channel", "channel_not_found")
    ts = _required("chat.update", params, "ts", "message_not_found")
    text, blocks = _content("chat.update", params)
    message = state.find_message(channel, ts)
    if message is None:
        raise ApiError("message_not_found")
    if message.get("bot_id") != BOT_ID:
        raise ApiError(
            "cant_update_message", f"chat.update: message {ts} in {channel} is not the bot's"
        )
    if "text" in params:
        message["text"] = text or ""
    if "blocks" in params:
        if blocks:
            message["blocks"] = blocks
        else:
            message.pop("blocks", None)
    message["edited"] = {"user": BOT_USER_ID, "ts": state.next_ts()}
    return {
        "ok": True,
        "channel": channel,
        "ts": ts,
        "text": message["text"],
        "message": copy.deepcopy(message),
    }


def chat_post_ephemeral(state: SlackState, params: dict[str, Any]) -> dict[str, Any]:
    channel = _required("chat.postEphemeral", params, "channel", "channel_not_found")
    user = _required("chat.postEphemeral", params, "user", "user_not_in_channel")
    text, blocks = _content("chat.postEphemeral", params)
    message = _message(state, text, blocks, thread_ts=params.get("thread_ts"))
    state.ephemerals.append({**message, "channel": channel, "to_user": user})
    return {"ok": True, "message_ts": message["ts"]}


def chat_schedule_message(state: SlackState, params: dict[str, Any]) -> dict[str, Any]:
    channel = _required("chat.scheduleMessage", params, "channel", "channel_not_found")
    raw_post_at = _required("chat.scheduleMessage", params, "post_at", "invalid_time")
    try:
        post_at = int(float(raw_post_at))
    except ValueError:
        raise ApiError(
            "invalid_time", f"chat.scheduleMessage: post_at {raw_post_at!r} is not a Unix time"
        ) from None
    text, blocks = _content("chat.scheduleMessage", params)
    now = time.time()
    if post_at <= now:
        raise ApiError("time_in_past", f"chat.scheduleMessage: post_at {post_at} is in the past")
    if post_at > now + MAX_SCHEDULE_AHEAD_S:
        raise ApiError("time_too_far", "chat.scheduleMessage: post_at is more than 120 days ahead")
    message = _message(state, text, blocks, thread_ts=params.get("thread_ts"))
    scheduled_id = state.next_id("Q")
    state.scheduled.append(
        {**message, "channel": channel, "post_at": post_at, "scheduled_message_id": scheduled_id}
    )
    return {
        "ok": True,
        "channel": channel,
        "scheduled_message_id": scheduled_id,
        "post_at": post_at,
        "message": copy.deepcopy(message),
    }


def conversations_open(state: SlackState, params: dict[str, Any]) -> dict[str, Any]:
    raw = params.get("users")
    users = raw if isinstance(raw, list) else str(raw or "").split(",")
    key = tuple(sorted(user.strip() for user in users if user.strip()))
    if not key:
        raise ApiError("users_list_not_supplied", "conversations.open: missing 'users'")
    already_open = key in state.dm_channels
    channel_id = state.dm_channels.setdefault(key, state.next_id("D"))
    return {"ok": True, "already_open": already_open, "channel": {"id": channel_id}}


def users_info(state: SlackState, params: dict[str, Any]) -> dict[str, Any]:
    user_id = _required("users.info", params, "user", "user_not_found")
    if not USER_ID.match(user_id):
        raise ApiError("user_not_found")
    name = "kvpilot" if user_id == BOT_USER_ID else user_id.lower()
    user: dict[str, Any] = {
        "id": user_id,
        "team_id": TEAM_ID,
        "name": name,
        "real_name": f"User {user_id}",
        "tz": "UTC",
        "tz_label": "Coordinated Universal Time",
        "tz_offset": 0,
        "is_bot": user_id == BOT_USER_ID,
        "deleted": False,
        "profile": {"real_name": f"User {user_id}", "display_name": name},
    }
    user.update(copy.deepcopy(state.users.get(user_id, {})))
    return {"ok": True, "user": user}


def usergroups_users_list(state: SlackState, params: dict[str, Any]) -> dict[str, Any]:
    group = _required("usergroups.users.list", params, "usergroup", "no_such_subteam")
    if group not in state.usergroups:
        raise ApiError("no_such_subteam")
    return {"ok": True, "users": list(state.usergroups[group])}


def files_get_upload_url_external(state: SlackState, params: dict[str, Any]) -> dict[str, Any]:
    method = "files.getUploadURLExternal"
    filename = _required(method, params, "filename")
    raw_length = _required(method, params, "length")
    try:
        length = int(raw_length)
    except ValueError:
        length = -1
    if length <= 0:
        raise ApiError(
            "invalid_arguments", f"{method}: length {raw_length!r} is not a positive int"
        )
    file_id = state.next_id("F")
    state.pending_uploads[file_id] = PendingUpload(
        id=file_id, filename=filename, length=length, alt_txt=params.get("alt_txt")
    )
    return {"ok": True, "upload_url": f"{state.base_url}upload/{file_id}", "file_id": file_id}


def files_complete_upload_external(state: SlackState, params: dict[str, Any]) -> dict[str, Any]:
    method = "files.completeUploadExternal"
    raw_files = _required(method, params, "files")
    try:
        entries = json.loads(raw_files) if isinstance(params["files"], str) else params["files"]
    except json.JSONDecodeError:
        raise ApiError("invalid_arguments", f"{method}: 'files' is not JSON") from None
    if not isinstance(entries, list) or not entries:
        raise ApiError("invalid_arguments", f"{method}: 'files' must be a non-empty JSON array")
    channel = params.get("channel_id") or (str(params.get("channels") or "").split(",")[0] or None)
    shared: list[dict[str, Any]] = []
    for entry in entries:
        pending = state.pending_uploads.get(str(entry.get("id")) if isinstance(entry, dict) else "")
        if pending is None:
            raise ApiError("file_not_found", f"{method}: unknown file id in {entry!r}")
        if pending.content is None:
            raise ApiError("file_not_found", f"{method}: bytes of {pending.id} were never uploaded")
        del state.pending_uploads[pending.id]
        uploaded = UploadedFile(
            id=pending.id,
            filename=pending.filename,
            title=str(entry.get("title") or pending.filename),
            content=pending.content,
            channel=channel,
            thread_ts=params.get("thread_ts") or None,
            initial_comment=params.get("initial_comment") or None,
            alt_txt=pending.alt_txt,
        )
        state.files.append(uploaded)
        shared.append(_file_json(state, uploaded))
    return {"ok": True, "files": shared}


def _file_json(state: SlackState, uploaded: UploadedFile) -> dict[str, Any]:
    mimetype = mimetypes.guess_type(uploaded.filename)[0] or "application/octet-stream"
    return {
        "id": uploaded.id,
        "name": uploaded.filename,
        "title": uploaded.title,
        "mimetype": mimetype,
        "size": len(uploaded.content),
        "user": BOT_USER_ID,
        "channels": [uploaded.channel] if uploaded.channel else [],
        "permalink": f"{state.base_url}files/{uploaded.id}",
    }


MAX_VIEW_BYTES = 250_000  # views.publish: "view_too_large" above 250 kB


def views_publish(state: SlackState, params: dict[str, Any]) -> dict[str, Any]:
    """A Home tab: `user_id` and a `home` view (JSON, as form bodies carry it); no scope is
    needed, but the app's Home tab must be on (`not_enabled` otherwise)."""
    user = _required("views.publish", params, "user_id", "invalid_arguments")
    if not USER_ID.match(user):
        raise ApiError("invalid_arguments", f"views.publish: invalid `user_id` {user!r}")
    raw = params.get("view")
    view = raw
    if isinstance(raw, str):
        try:
            view = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ApiError("invalid_arguments", f"views.publish: not JSON ({exc})") from None
    if not isinstance(view, dict) or view.get("type") != "home":
        raise ApiError("invalid_arguments", "views.publish: the view must be a 'home' view")
    if len(json.dumps(view)) > MAX_VIEW_BYTES:
        raise ApiError("view_too_large", "views.publish: the view is larger than 250 kB")
    if not manifest_home_tab():
        raise ApiError("not_enabled", "views.publish: the app's Home tab is not turned on")
    blocks = view.get("blocks")
    if not isinstance(blocks, list):
        raise ApiError("invalid_arguments", "views.publish: the view has no blocks array")
    problems = block_problems(blocks, None, limit=MAX_BLOCKS_PER_VIEW, view=True)
    if problems:
        raise ApiError("invalid_blocks", "views.publish: " + "; ".join(problems))
    extra = set(view) - {"type", "blocks", "private_metadata", "callback_id", "external_id"}
    if extra:
        raise ApiError("invalid_arguments", f"views.publish: unknown view keys {sorted(extra)}")
    state.home_views.setdefault(user, []).append(copy.deepcopy(view))
    return {"ok": True, "view": {"id": state.next_id("V"), **copy.deepcopy(view)}}


def apps_connections_open(state: SlackState, params: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, "url": state.socket_url}


METHODS: dict[str, Method] = {
    "auth.test": auth_test,
    "chat.postMessage": chat_post_message,
    "chat.update": chat_update,
    "chat.postEphemeral": chat_post_ephemeral,
    "chat.scheduleMessage": chat_schedule_message,
    "conversations.open": conversations_open,
    "conversations.info": conversations_info,
    "users.info": users_info,
    "usergroups.users.list": usergroups_users_list,
    "files.getUploadURLExternal": files_get_upload_url_external,
    "files.completeUploadExternal": files_complete_upload_external,
    "apps.connections.open": apps_connections_open,
    "views.publish": views_publish,
}


def upload_bytes(state: SlackState, file_id: str, content: bytes) -> tuple[int, str]:
    """Step 2 of files_upload_v2: the raw bytes, checked against the declared length."""
    pending = state.pending_uploads.get(file_id)
    if pending is None:
        raise ApiError("file_not_found", f"upload: no upload URL was issued for {file_id}")
    if len(content) != pending.length:
        raise ApiError(
            "length_mismatch",
            f"upload: {file_id} declared {pending.length} bytes but {len(content)} arrived",
        )
    pending.content = content
    return 200, f"OK - {len(content)}"


def post_to_hook(state: SlackState, name: str, body: dict[str, Any]) -> None:
    """A response_url post: record it, then apply it to the channel the URL is bound to.

    ``replace_original``/``delete_original`` act on the bound message (which must be the
    bot's); otherwise an ``in_channel`` reply becomes a new message and anything else an
    ephemeral one, as Slack does.
    """
    target = state.hooks.setdefault(name, HookTarget(channel=None, message_ts=None))
    where = f"response_url {name!r}"
    if len(target.posts) >= MAX_HOOK_POSTS:
        raise ApiError("used_url", f"{where}: more than {MAX_HOOK_POSTS} posts")
    delete = bool(body.get("delete_original"))
    text, blocks = _content(where, body, need_content=not delete)
    target.posts.append(copy.deepcopy(body))
    if target.channel is None:
        return
    if delete or body.get("replace_original"):
        _apply_to_original(state, target, where, delete, text, blocks)
    elif body.get("response_type") == "in_channel":
        message = _message(state, text, blocks, thread_ts=body.get("thread_ts"))
        state.channel(target.channel)[message["ts"]] = message
    else:
        message = _message(state, text, blocks, thread_ts=body.get("thread_ts"))
        state.ephemerals.append({**message, "channel": target.channel, "to_user": None})


def _apply_to_original(
    state: SlackState,
    target: HookTarget,
    where: str,
    delete: bool,
    text: str | None,
    blocks: list[Any] | None,
) -> None:
    original = state.find_message(str(target.channel), target.message_ts or "")
    if original is None:
        return  # an ephemeral original (or one already deleted): nothing persistent to change
    if original.get("bot_id") != BOT_ID:
        raise ApiError(
            "cant_update_message", f"{where}: original message {original['ts']} is not the bot's"
        )
    if delete:
        del state.channels[str(target.channel)][original["ts"]]
        return
    original["text"] = text or ""
    if blocks:
        original["blocks"] = blocks
    else:
        original.pop("blocks", None)
    original["edited"] = {"user": BOT_USER_ID, "ts": state.next_ts()}
