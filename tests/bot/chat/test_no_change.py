"""A change that changes nothing, in chat: never proposed (no Approve button), and a stored
proposal that changes nothing by now is refused at approval, with no restart.

The chat core (`bot.chat.flow.Kvpilot`) with a surface that keeps what it is given, against
the incident twin behind kvpilot's process launcher (it runs `--mem-fraction-static 0.85`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest

from bot.app.config import Config, load
from bot.app.wiring import database, make_clock
from bot.app.wiring import launcher as wiring_launcher
from bot.chat.auth import Principal
from bot.chat.flow import Kvpilot
from bot.chat.messages import Message
from bot.chat.views import APPROVE
from playbooks.clock import WallClock
from storage import audit, chat
from storage import experiments as store
from storage import proposals as proposal_store
from storage.chat import MessageRef
from tests.bot.harness import CHANNEL, started, twin_config
from tests.twin_process import free_port

SLACK = f"""[slack]
approvers = ["U2"]
operators = ["U1"]
channels = ["{CHANNEL}"]
four_eyes = true
"""
OPTION: dict[str, object] = {
    "title": "mem_fraction_static 0.85", "verdict": "possible", "reasons": [],
    "predicted_max_total_num_tokens": None, "predicted_throughput_change": None,
}  # fmt: skip
OPERATOR = Principal("U1", CHANNEL)
APPROVER = Principal("U2", CHANNEL)


@dataclass
class Kept:
    """A surface that keeps what it is given: posts, edits and whispers."""

    channel: str = CHANNEL
    posted: dict[str, Message] = field(default_factory=dict)
    whispers: list[str] = field(default_factory=list)

    def post(self, message: Message, *, thread: MessageRef | None = None) -> MessageRef:
        ref = MessageRef(self.channel, str(len(self.posted) + 1))
        self.posted[ref.message_id] = message
        return ref

    def update(self, ref: MessageRef, message: Message) -> None:
        self.posted[ref.message_id] = message

    def upload(
        self, data: bytes, *, filename: str, title: str, thread: MessageRef | None = None
    ) -> None:
        pass

    def whisper(self, who: Principal, message: Message) -> None:
        self.whispers.append(message.text)


@pytest.fixture
def config(tmp_path: Path) -> Iterator[Config]:
    path = twin_config(tmp_path, free_port(), slack=SLACK)
    with started(path, "incident"):
        yield load(str(path))


@pytest.fixture
def kv(config: Config) -> Iterator[tuple[Kvpilot, Kept]]:
    surface = Kept()
    db = database(config)
    bot = Kvpilot(
        config,
        lambda: database(config),
        clock=make_clock(config, db),
        group_members=lambda _group: frozenset(),
        surface_for=lambda _channel: surface,
    )
    try:
        yield bot, surface
    finally:
        bot.close()


def approve_buttons(message: Message) -> list[str]:
    return [b.value for b in message.buttons if b.action_id == APPROVE]


def restarts(config: Config) -> int:
    return len(audit.events(database(config), name="restart_started"))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("propose incident mem_fraction_static=0.850", "mem_fraction_static is already 0.85"),
        ("propose incident enable_hierarchical_cache=false", "enable_hierarchical_cache is "
         "already off"),
    ],
)  # fmt: skip
def test_a_typed_proposal_that_changes_nothing_gets_no_approve_button(
    config: Config, kv: tuple[Kvpilot, Kept], text: str, why: str
) -> None:
    bot, surface = kv
    reply = bot.command(OPERATOR, text)
    assert reply.work is not None, reply.now
    reply.work(surface)
    assert [m for m in surface.posted.values() if approve_buttons(m)] == []
    (said,) = surface.whispers
    assert "nothing would change" in said and why in said, said
    assert "process launcher" in said, said  # where the arguments were read from
    assert chat.pending_proposals(database(config)) == []
    assert store.list_experiments(database(config)) == []


def test_a_proposal_that_changes_nothing_by_now_is_refused_at_approval(
    config: Config, kv: tuple[Kvpilot, Kept]
) -> None:
    bot, surface = kv
    proposal_id = bot.propose(OPERATOR, surface, "incident", {"mem_fraction_static": 0.88},
                              force=False)  # fmt: skip
    assert proposal_id is not None
    ref = chat.find_message(database(config), "proposal", proposal_id, "approval")
    assert ref is not None
    (value,) = approve_buttons(surface.posted[ref.message_id])
    # someone sets 0.88 by hand, with a launcher of their own
    person = wiring_launcher(config, config.server("incident"), WallClock())
    args = person.current_args()
    at = args.index("--mem-fraction-static")
    person.apply([*args[:at], "--mem-fraction-static", "0.88", *args[at + 2 :]])
    instance, before = person.identity(), restarts(config)

    reply = bot.action(APPROVER, APPROVE, value, ref)
    assert reply.work is not None
    reply.work(surface)

    said = surface.whispers[-1]
    assert "Not approved" in said and "nothing would change" in said, said
    assert "mem_fraction_static is already 0.88" in said, said
    db = database(config)
    assert store.list_experiments(db) == []
    assert person.identity() == instance and restarts(config) == before  # not restarted
    assert not approve_buttons(surface.posted[ref.message_id])  # the proposal is closed
    assert "nothing would change" in surface.posted[ref.message_id].text


def test_a_stored_proposal_that_changes_nothing_is_refused_at_approval(
    config: Config, kv: tuple[Kvpilot, Kept]
) -> None:
    """A proposal recorded before kvpilot refused them: its plan restarts the server into the
    arguments it already runs."""
    bot, surface = kv
    db = database(config)
    current = wiring_launcher(config, config.server("incident"), WallClock()).current_args()
    now = bot.now()
    row = proposal_store.create_proposal(
        db, server="incident", change={"mem_fraction_static": 0.85},
        plan={"server": "incident", "change": {"mem_fraction_static": 0.85},
              "from_args": current, "to_args": current, "verdict": "possible",
              "option": OPTION,
              "gate": vars(config.server("incident").gate)},
        snapshot={"args": current, "running": 0, "queued": 0},
        created_by="U1", now=now, expires_at=now + timedelta(minutes=30),
    )  # fmt: skip
    message = bot.approval_message(row, OPTION)
    assert not approve_buttons(message) and "no change" in message.text  # shown now
    ref = surface.post(message)
    chat.remember_message(db, "proposal", row.id, "approval", ref, now=now)

    # the button such a proposal was posted with before
    reply = bot.action(APPROVER, APPROVE, f"{row.id}:{row.plan_hash[:16]}", ref)
    assert reply.work is not None
    reply.work(surface)

    assert store.list_experiments(db) == [], "approved: an experiment was started"
    said = surface.whispers[-1]
    assert "Not approved" in said and "nothing would change" in said, said
    assert "mem_fraction_static is already 0.85" in said, said
    assert store.list_experiments(db) == [] and restarts(config) == 0
