"""What the local Slack server remembers: calls, messages, files, hooks, faults and violations.

One lock (a Condition, so waiters wake when a call arrives) guards everything, because the HTTP
server answers each request on its own thread while the test thread reads the same records.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

BOT_USER_ID = "UBOT"
BOT_ID = "B0BOT"
TEAM_ID = "T1"
APP_ID = "A0FAKE"


@dataclass(frozen=True)
class Call:
    """One request as the server received it; ``headers`` keys are lower case."""

    method: str
    path: str
    headers: dict[str, str]
    params: dict[str, Any]
    raw: bytes
    at: float


@dataclass
class UploadedFile:
    """A file shared through files_upload_v2 (all three steps completed)."""

    id: str
    filename: str
    title: str
    content: bytes
    channel: str | None
    thread_ts: str | None
    initial_comment: str | None
    alt_txt: str | None = None


@dataclass
class PendingUpload:
    """A file id handed out by files.getUploadURLExternal, waiting for its bytes."""

    id: str
    filename: str
    length: int
    alt_txt: str | None
    content: bytes | None = None


@dataclass(frozen=True)
class Fault:
    """One scripted failure for the next call of a method."""

    error: str | None
    status: int
    retry_after: int | None
    delay_s: float = 0.0  # the answer comes this late (past the client's timeout: none it sees)


@dataclass
class HookTarget:
    """The message a response_url belongs to, when the test said so."""

    channel: str | None
    message_ts: str | None
    posts: list[dict[str, Any]] = field(default_factory=list)


MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "slack" / "manifest.yaml"


def manifest_scopes() -> tuple[str, ...]:
    """The bot scopes an app installed from deploy/slack/manifest.yaml holds."""
    return tuple(yaml.safe_load(MANIFEST.read_text())["oauth_config"]["scopes"]["bot"])


def manifest_home_tab() -> bool:
    """Whether the app installed from the manifest has its Home tab turned on."""
    features = yaml.safe_load(MANIFEST.read_text()).get("features") or {}
    return bool((features.get("app_home") or {}).get("home_tab_enabled"))


DEFAULT_SCOPES = manifest_scopes()


class ApiError(Exception):
    """A Slack error code; ``violation`` is set when the caller broke the API contract."""

    def __init__(
        self, error: str, violation: str | None = None, extra: dict[str, Any] | None = None
    ) -> None:
        super().__init__(error)
        self.error = error
        self.violation = violation
        self.extra = extra or {}  # fields Slack adds to some errors (missing_scope: needed)


class SlackState:
    """Records and workspace state shared by the HTTP and Socket Mode servers."""

    def __init__(
        self,
        usergroups: dict[str, list[str]] | None = None,
        users: dict[str, dict[str, Any]] | None = None,
        scopes: tuple[str, ...] = DEFAULT_SCOPES,
        outside: tuple[str, ...] = (),
        private: tuple[str, ...] = (),
    ) -> None:
        self.cond = threading.Condition()
        self.scopes = tuple(scopes)  # the bot token's granted scopes
        self.outside = set(outside)  # channels the bot is not a member of
        self.private = set(private)  # private channels (the bot sees them only as a member)
        self.usergroups = {name: list(members) for name, members in (usergroups or {}).items()}
        self.users = copy.deepcopy(users or {})
        self.calls: list[Call] = []
        self.violations: list[str] = []
        self.channels: dict[str, dict[str, dict[str, Any]]] = {}
        self.ephemerals: list[dict[str, Any]] = []
        self.scheduled: list[dict[str, Any]] = []
        self.pending_uploads: dict[str, PendingUpload] = {}
        self.files: list[UploadedFile] = []
        self.hooks: dict[str, HookTarget] = {}
        self.dm_channels: dict[tuple[str, ...], str] = {}
        self.home_views: dict[str, list[dict[str, Any]]] = {}  # user -> views published, in order
        self.faults: dict[str, deque[Fault]] = {}
        self.base_url = ""  # http://127.0.0.1:PORT/ once the HTTP server is bound
        self.socket_url = ""  # ws://127.0.0.1:PORT2/link once the socket server is bound
        self._last_micros = 0
        self._serial = 0

    # -- identifiers -------------------------------------------------------------------------
    def next_ts(self) -> str:
        """A Slack-style ts: current time in microseconds, strictly increasing."""
        micros = max(int(time.time() * 1_000_000), self._last_micros + 1)
        self._last_micros = micros
        return f"{micros // 1_000_000}.{micros % 1_000_000:06d}"

    def next_id(self, prefix: str) -> str:
        self._serial += 1
        return f"{prefix}{self._serial:08d}"

    # -- records (callers hold ``cond``) -----------------------------------------------------
    def record(self, call: Call) -> None:
        self.calls.append(call)
        self.cond.notify_all()

    def violate(self, message: str) -> None:
        self.violations.append(message)
        self.cond.notify_all()

    def take_fault(self, method: str) -> Fault | None:
        queue = self.faults.get(method)
        return queue.popleft() if queue else None

    def channel(self, channel_id: str) -> dict[str, dict[str, Any]]:
        return self.channels.setdefault(channel_id, {})

    def find_message(self, channel_id: str, ts: str) -> dict[str, Any] | None:
        return self.channels.get(channel_id, {}).get(ts)
