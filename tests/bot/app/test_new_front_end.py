"""A new chat front end is its surface, its identity part, an entry that builds the runtime,
its command, and one line in `bot.app.front_ends.FRONT_ENDS`.

`memory_chat/` is one, kept in memory and speaking Mattermost's IDs (26 lowercase letters and
digits, which Slack's syntax refuses): nothing else of kvpilot changes for it, a command typed
there is authorised, answered and posted through the same `Runtime` as Slack's, and once
registered, `[kvpilot] chat = "mattermost"` makes every command read kvpilot.toml its way.
"""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from bot.app.config import ConfigError, parse
from bot.app.front_ends import CHATS, FRONT_ENDS
from bot.cli import main as cli
from bot.slack.identity import SLACK
from tests.bot.app.memory_chat.entry import MemoryChat
from tests.bot.app.memory_chat.identity import MattermostIdentity

ALICE, BOB, CAROL = "a" * 26, "b" * 26, "c" * 26
OPS, TOWN_SQUARE = "o" * 26, "t" * 26  # a group of operators, a channel


def tables(tmp_path: Path) -> dict[str, Any]:
    return {
        "kvpilot": {"database": str(tmp_path / "kvpilot.db"), "state_dir": str(tmp_path)},
        "servers": {"incident": {"url": "http://127.0.0.1:9"}},
        "sampler": {"enabled": False},  # nothing to sample: no server runs here
        "access": {"approvers": [ALICE], "operators": [OPS]},
    }


@pytest.fixture
def chat(tmp_path: Path) -> Any:
    ids = MattermostIdentity({OPS: frozenset({BOB})})
    front_end = MemoryChat(parse(tables(tmp_path), tmp_path / "kvpilot.toml", ids=ids), ids)
    before = set(threading.enumerate())
    front_end.runtime.start()
    yield front_end
    front_end.runtime.stop("test")
    deadline = time.monotonic() + 10
    while [t for t in set(threading.enumerate()) - before if t.is_alive()]:
        assert time.monotonic() < deadline, "the stopped runtime left threads running"
        time.sleep(0.05)


def test_its_ids_are_checked_by_its_own_identity(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="neither a Slack ID nor a local account"):
        parse(tables(tmp_path), tmp_path / "kvpilot.toml", ids=SLACK)
    with pytest.raises(ConfigError, match="'Alice' is not a Mattermost ID"):
        parse(
            {**tables(tmp_path), "access": {"approvers": ["Alice"]}},
            tmp_path / "kvpilot.toml",
            ids=MattermostIdentity({}),
        )


def test_a_command_runs_through_the_runtime_and_is_answered(chat: MemoryChat) -> None:
    assert "/kvpilot diagnose" in chat.command(CAROL, TOWN_SQUARE, "help")
    refused = chat.command(CAROL, TOWN_SQUARE, "freeze all maintenance")
    assert "only operators and approvers may freeze" in refused
    # BOB is an operator through the OPS group, and is written the identity's way
    chat.command(BOB, TOWN_SQUARE, "freeze all maintenance")
    assert chat.log[-1][0] == TOWN_SQUARE
    assert f"@{BOB} froze changes to every server" in chat.log[-1][1]
    chat.command(ALICE, TOWN_SQUARE, "unfreeze all")
    assert f"@{ALICE} lifted the freeze" in chat.log[-1][1]


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registering the front end: the one line a new one adds (to `FRONT_ENDS` itself)."""
    monkeypatch.setitem(FRONT_ENDS, "mattermost", "tests.bot.app.memory_chat.front_end")


def with_chat(tmp_path: Path, chat: str) -> dict[str, Any]:
    data = tables(tmp_path)
    return {**data, "kvpilot": {**data["kvpilot"], "chat": chat}}


@pytest.mark.usefixtures("registered")
def test_chat_names_whose_ids_the_file_holds(tmp_path: Path) -> None:
    config = parse(with_chat(tmp_path, "mattermost"), tmp_path / "kvpilot.toml", ids=CHATS)
    assert config.chat == "mattermost"
    assert config.access is not None and config.access.approvers == (ALICE,)
    with pytest.raises(ConfigError, match="neither a Slack ID nor a local account"):
        parse(with_chat(tmp_path, "slack"), tmp_path / "kvpilot.toml", ids=CHATS)
    with pytest.raises(ConfigError, match="neither a Slack ID nor a local account"):
        parse(tables(tmp_path), tmp_path / "kvpilot.toml", ids=CHATS)  # Slack's by default
    unknown = 'kvpilot.chat: .teams. is not .*; use one of "slack", "terminal", "mattermost"'
    with pytest.raises(ConfigError, match=unknown):
        parse(with_chat(tmp_path, "teams"), tmp_path / "kvpilot.toml", ids=CHATS)


@pytest.mark.usefixtures("registered")
def test_its_command_reads_the_file_its_way_and_slacks_refuses_it(tmp_path: Path) -> None:
    path = tmp_path / "kvpilot.toml"
    path.write_text(
        f'[kvpilot]\nchat = "mattermost"\ndatabase = "kvpilot.db"\nstate_dir = "state"\n'
        f'[servers.incident]\nurl = "http://127.0.0.1:9"\n[sampler]\nenabled = false\n'
        f'[access]\napprovers = ["{ALICE}"]\noperators = ["{OPS}"]\n'
    )
    out, err = io.StringIO(), io.StringIO()
    args = ["--config", str(path), "--user", CAROL, "--channel", TOWN_SQUARE, "-c", "help"]
    assert cli(["mattermost", *args], out, err) == 0, err.getvalue()
    assert "/kvpilot diagnose" in out.getvalue()
    assert cli(["serve", "--config", str(path)], out, err) == 2
    assert "holds Mattermost IDs" in err.getvalue()
    assert "run `kvpilot mattermost`" in err.getvalue()
