"""A button's value comes back from the chat service as the bot made it, unless someone forged
the request: a value kvpilot never makes is refused before anything is looked up, and a
Propose button proposes only an option whose button was offered."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bot.app.config import load
from bot.app.runtime import Runtime
from bot.chat.auth import Principal
from bot.chat.identity import OPAQUE
from bot.chat.messages import Message
from storage import chat
from tests.bot.chat.test_runner_errors import Recorder

OPERATOR = Principal("U1", "C1")


class Whispers(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.said: list[str] = []

    def whisper(self, who: Principal, message: Message) -> None:
        self.said.append(message.text)


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    path = tmp_path / "kvpilot.toml"
    path.write_text(
        '[kvpilot]\ndatabase = "kvpilot.db"\n[servers.a]\nurl = "http://127.0.0.1:9"\n'
        '[slack]\noperators = ["U1"]\napprovers = ["U2"]\nchannels = ["C1"]\n'
    )
    built = Runtime(load(str(path)), surface_for=lambda _c: Recorder(), ids=OPAQUE)
    yield built
    built.close()


@pytest.mark.parametrize(
    ("action", "value"),
    [
        ("kvpilot.propose", "1:-1"),  # the last option, whatever it is
        ("kvpilot.propose", "1:+0"),
        ("kvpilot.propose", "-1:0"),
        ("kvpilot.propose", "99999999999999999999999:0"),  # past SQLite's INTEGER
        ("kvpilot.approve", "99999999999999999999999:0123456789abcdef"),
        ("kvpilot.approve", "٣:0123456789abcdef"),  # a digit, but not one kvpilot writes
    ],
)
def test_a_value_kvpilot_never_makes_is_refused(runtime: Runtime, action: str, value: str) -> None:
    reply = runtime.flow.action(OPERATOR, action, value, None)
    assert reply.work is None and reply.now is not None
    assert "not one kvpilot made" in reply.now.text


def test_a_propose_button_proposes_only_an_offered_option(runtime: Runtime) -> None:
    options = [
        {"title": "Raise the fraction", "change": {"mem_fraction_static": 0.88},
         "verdict": "recommended"},
        {"title": "Fp8 KV", "change": {"kv_cache_dtype": "fp8_e4m3"}, "verdict": "unsafe"},
    ]  # fmt: skip
    diag = chat.save_diagnosis(
        runtime.flow.db(), "a", {"server": "a", "options": options}, created_by="U1",
        now=datetime.now(UTC),
    )  # fmt: skip
    surface = Whispers()
    reply = runtime.flow.action(OPERATOR, "kvpilot.propose", f"{diag}:1", None)
    assert reply.work is not None
    reply.work(surface)
    assert surface.said == [":warning: That option no longer exists."]
    assert chat.pending_proposals(runtime.flow.db()) == []
