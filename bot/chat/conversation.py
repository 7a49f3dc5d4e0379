"""What the conversation's parts may call back: `bot.chat.flow.Kvpilot`, named by a protocol.

`Kvpilot` calls the command handlers (`dispatch`), freezes, notifications, campaigns and the
home messages, and they call back into it. They name it by this protocol, never by importing
`bot.chat.flow`, not even for type checking, so the chat core has no import circle
(`tests/test_architecture.py`); `Kvpilot` provides every member, which mypy checks wherever
it is passed as a `Conversation`.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from datetime import datetime
from typing import Any, Protocol

from sqlite_utils import Database

from bot.app.config import Config
from bot.chat.auth import GroupMembers, Principal
from bot.chat.commands import Command
from bot.chat.decisions import Refusal
from bot.chat.identity import Identity
from bot.chat.messages import Message
from bot.chat.surface import Surface
from playbooks.clock import Clock
from playbooks.engines.types import Option
from storage import proposals as proposal_store
from storage.chat import MessageRef

# the slow part of a request, run after the immediate answer with the surface to answer on
Work = Callable[[Surface], object]


class Conversation(Protocol):
    config: Config
    ids: Identity
    clock: Clock
    now: Callable[[], datetime]
    group_members: GroupMembers
    surface_for: Callable[[str], Surface]
    direct: Callable[[str], Surface | None]
    report_hook: Callable[[Command, Principal, Surface], None] | None

    def db(self) -> Database: ...

    def refusal(self, server: str, doing: str) -> str | None:
        """Why this bot may not change `server` now (another bot claims it); None if it may."""
        ...

    def submit(
        self,
        work: Work,
        surface: Surface,
        on_failure: Callable[[Exception], None] | None = None,
    ) -> Future[None]: ...

    def run_diagnose(
        self, server: str, who: Principal, surface: Surface, thread: MessageRef | None = None
    ) -> list[Option] | None: ...

    def propose(
        self,
        who: Principal,
        surface: Surface,
        server: str,
        change: dict[str, Any],
        *,
        force: bool,
        diagnosis_id: int | None = None,
        thread: MessageRef | None = None,
        predicted: tuple[float, float] | None = None,
        recommended: bool = False,
        measured_tokens: int | None = None,
    ) -> int | None: ...

    def decide(
        self,
        who: Principal,
        surface: Surface,
        proposal_id: int,
        hash_prefix: str,
        decision: str,
        where: MessageRef | None,
        *,
        start: bool = True,
        refused: Callable[[Refusal], None] | None = None,
    ) -> int | None: ...

    def decide_by_id(
        self, who: Principal, surface: Surface, proposal_id: int, verb: str
    ) -> None: ...

    def abort(self, who: Principal, surface: Surface, exp_id: int) -> None: ...

    def approval_message(
        self, row: proposal_store.ProposalRow, option: dict[str, Any], restartable: bool = True
    ) -> Message: ...

    def status_message(self, server: str | None) -> Message: ...

    def history_message(self, server: str | None) -> Message: ...

    def _stamp(
        self, row: proposal_store.ProposalRow, ref: MessageRef | None, surface: Surface, text: str
    ) -> None: ...
