"""Drive the real Bolt app over loopback HTTP with signed requests, like Slack does."""

from __future__ import annotations

import io
import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import uvicorn
from slack_sdk.signature import SignatureVerifier

from bot.app.config import load
from bot.cli import main as cli_main
from bot.slack.serve import Bot, SlackSettings
from sim.models import LLAMA_3_1_8B, write_model_dir
from tests.ports import free_port
from tests.slackfake import FakeSlack

SECRET = "test-signing-secret"
CHANNEL = "C0OPS"


def twin_config(
    tmp_path: Path,
    port: int,
    *,
    scale: float = 200,
    slack: str = "",
    preset: str = "kimi-k2.5-rtxpro6000-tp8",
    gate: str = "scrape_s = 10\nbatch_s = 60\n",
) -> Path:
    command = [
        sys.executable, "-m", "sim.launch_server", "--preset", preset, "--port", str(port),
        "--mem-fraction-static", "0.85", "--enable-metrics", "--time-scale", str(scale),
        "--workload", "incident", "--concurrency", "150",
    ]  # fmt: skip
    path = tmp_path / "kvpilot.toml"
    path.write_text(
        f"[kvpilot]\ntime_scale = {scale}\n\n[gate]\n{gate}\n"
        f"{slack}\n"
        f'[servers.incident]\nurl = "http://127.0.0.1:{port}"\n'
        "gpu_memory_gib = 95.59\nhost_ram_gib = 256\n"
        '[servers.incident.launcher]\nkind = "process"\n'
        f"command = {json.dumps(command)}\n"
    )
    return path


def vllm_twin_config(tmp_path: Path, port: int, *, slack: str = "") -> Path:
    """The vLLM twin's incident (`make demo ENGINE=vllm`'s) behind the process launcher, served
    from a model directory as a real vLLM is, at 100x."""
    model = write_model_dir(LLAMA_3_1_8B, tmp_path / "models" / "llama")
    command = [
        sys.executable, "-m", "sim.vllm", "serve", str(model), "--preset", "llama-3.1-8b-h100",
        "--port", str(port), "--time-scale", "100", "--workload", "incident",
        "--concurrency", "96", "--gpu-memory-utilization", "0.35", "--max-model-len", "32768",
        "--max-num-seqs", "64",
    ]  # fmt: skip
    path = tmp_path / "kvpilot.toml"
    path.write_text(
        "[kvpilot]\ntime_scale = 100\n\n[gate]\nscrape_s = 10\nbatch_s = 60\n"
        f"max_trial_s = 900\n\n{slack}\n"
        f'[servers.incident]\nurl = "http://127.0.0.1:{port}"\nengine = "vllm"\n'
        "gpu_memory_gib = 79.65\n"
        '[servers.incident.launcher]\nkind = "process"\n'
        f"command = {json.dumps(command)}\n"
    )
    return path


class FakeNow:
    """A wall clock the test can move forward (approval expiry)."""

    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset


class SlackDriver:
    """Sends what Slack would send to the bot's /slack/events, signed."""

    def __init__(self, url: str, slack: FakeSlack) -> None:
        self.url = url
        self.slack = slack
        self.http = httpx.Client(timeout=10)
        self.verifier = SignatureVerifier(SECRET)
        self.last: tuple[str, dict[str, str]] | None = None

    def send(
        self, body: str, content_type: str, *, signed: bool = True, age_s: float = 0
    ) -> httpx.Response:
        ts = str(int(time.time() - age_s))
        headers: dict[str, str] = {"content-type": content_type, "x-slack-request-timestamp": ts}
        if signed:
            signature = self.verifier.generate_signature(timestamp=ts, body=body)
            assert signature is not None
            headers["x-slack-signature"] = signature
        self.last = (body, headers)
        return self.http.post(self.url, content=body, headers=headers)

    def replay(self) -> httpx.Response:
        assert self.last is not None
        body, headers = self.last
        return self.http.post(self.url, content=body, headers=headers)

    def slash(
        self,
        text: str,
        *,
        user: str = "U1",
        channel: str = CHANNEL,
        hook: str | None = None,
        **kw: Any,
    ) -> httpx.Response:
        """`/kvpilot TEXT`; `hook` names its response_url (`FakeSlack.hooks(hook)`)."""
        body = urlencode(
            {
                "token": "legacy",
                "team_id": "T1",
                "team_domain": "example",
                "channel_id": channel,
                "channel_name": "ops",
                "user_id": user,
                "user_name": user.lower(),
                "command": "/kvpilot",
                "text": text,
                "api_app_id": "A1",
                "response_url": self.slack.response_url(hook or f"cmd-{time.monotonic_ns()}"),
                "trigger_id": "1.2.3",
            }
        )
        return self.send(body, "application/x-www-form-urlencoded", **kw)

    def event(self, event: dict[str, Any]) -> httpx.Response:
        """An Events API callback carrying `event` (e.g. `app_home_opened`), as Slack posts it."""
        body = {
            "token": "legacy",
            "team_id": "T1",
            "api_app_id": "A1",
            "event": {"event_ts": str(time.time()), **event},
            "type": "event_callback",
            "event_id": f"Ev{time.monotonic_ns()}",
            "event_time": int(time.time()),
        }
        return self.send(json.dumps(body), "application/json")

    def click_home(self, action_id: str, value: str, *, user: str) -> httpx.Response:
        """A click on a button of kvpilot's Home tab: a view, no channel, no message."""
        payload = click_payload(self.slack, action_id, value, user, "0", CHANNEL)
        for key in ("channel", "message", "response_url"):
            del payload[key]
        payload["container"] = {"type": "view", "view_id": "V1"}
        payload["view"] = {"id": "V1", "type": "home", "blocks": [], "callback_id": ""}
        return self.send(
            "payload=" + quote(json.dumps(payload)), "application/x-www-form-urlencoded"
        )

    def click(
        self, action_id: str, value: str, *, user: str, message_ts: str, channel: str = CHANNEL
    ) -> httpx.Response:
        payload = click_payload(self.slack, action_id, value, user, message_ts, channel)
        return self.send(
            "payload=" + quote(json.dumps(payload)), "application/x-www-form-urlencoded"
        )


def click_payload(
    slack: FakeSlack, action_id: str, value: str, user: str, message_ts: str, channel: str = CHANNEL
) -> dict[str, Any]:
    """The block_actions payload of a click on one of kvpilot's buttons, as Slack sends it
    (over HTTP form-encoded, in Socket Mode as an `interactive` envelope's payload)."""
    return {
        "type": "block_actions",
        "team": {"id": "T1", "domain": "example"},
        "user": {"id": user, "username": user.lower(), "team_id": "T1"},
        "api_app_id": "A1",
        "token": "legacy",
        "container": {"type": "message", "message_ts": message_ts, "channel_id": channel},
        "trigger_id": "1.2.3",
        "channel": {"id": channel, "name": "ops"},
        "message": {"type": "message", "ts": message_ts, "text": ""},
        "response_url": slack.response_url(f"act-{time.monotonic_ns()}"),
        "actions": [
            {
                "action_id": action_id,
                "block_id": "kvpilot-actions-0",
                "value": value,
                "type": "button",
                "action_ts": str(time.time()),
            }
        ],
    }


def run_cli(*args: str) -> tuple[int, str, str]:
    """`kvpilot ARGS` in this process: the exit status, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    return cli_main(list(args), out=out, err=err), out.getvalue(), err.getvalue()


@contextmanager
def started(config: Path, *servers: str) -> Iterator[Path]:
    """`servers` of `config` started by kvpilot's launcher, and stopped after."""
    for name in servers:
        code, _, err = run_cli("server", "start", "--server", name, "--config", str(config))
        assert code == 0, err
    try:
        yield config
    finally:
        for name in servers:
            run_cli("server", "stop", "--server", name, "--config", str(config))


def buttons(message: dict[str, Any]) -> dict[str, str]:
    """action_id -> value (the first of each) of a message's buttons."""
    out: dict[str, str] = {}
    for block in message.get("blocks") or []:
        if block.get("type") == "actions":
            for el in block["elements"]:
                out.setdefault(el["action_id"].split("#")[0], el["value"])
    return out


def posted(
    slack: FakeSlack, needle: str, channel: str = CHANNEL
) -> tuple[str, dict[str, Any]] | None:
    """The first message (ts, message) in `channel` whose text holds `needle`."""
    for ts, m in slack.messages(channel).items():
        if needle in (m.get("text") or ""):
            return ts, m
    return None


def wait_until(predicate: Any, timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@contextmanager
def running_bot(
    config_path: Path,
    slack: FakeSlack,
    *,
    now: FakeNow | None = None,
    app_token: str | None = None,
    **bot_options: Any,
) -> Iterator[tuple[Bot, SlackDriver]]:
    config = load(str(config_path))
    settings = SlackSettings("xoxb-test", app_token, None if app_token else SECRET, slack.api_url)
    before = set(threading.enumerate())
    bot = Bot(config, settings, progress_every_s=0.5, now=now or FakeNow(), **bot_options)
    bot.start_background()
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            bot.http_app(), host="127.0.0.1", port=port, log_level="warning", lifespan="off"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 10, "the bot's HTTP server")
    if app_token:
        bot.start_socket_mode()
    try:
        yield bot, SlackDriver(f"http://127.0.0.1:{port}/slack/events", slack)
    finally:
        bot.stop()
        bot.flow.runner.join(60)
        server.should_exit = True
        thread.join(10)
        left_running(before, "the stopped bot")


# Threads of the process that a stopped bot may leave: uvicorn's, Python's own and the
# stand-in Slack's (the test's fixtures stop those).
NOT_THE_BOTS = ("asyncio_", "Thread-", "MainThread", "slackfake")


def left_running(before: set[threading.Thread], what: str) -> None:
    """Nothing a stopped bot started may still run: a timer of an experiment left behind
    posts to a Slack that is gone, into whichever test runs next on the same worker."""
    deadline = time.monotonic() + 10
    while True:
        left = [
            t.name
            for t in set(threading.enumerate()) - before
            if t.is_alive() and not t.name.startswith(NOT_THE_BOTS)
        ]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, f"{what} left threads running: {sorted(left)}"
