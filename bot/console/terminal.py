"""`kvpilot console`: the same bot in a terminal, for operators without Slack and for the demo.

Commands are typed as in Slack, without the slash (`diagnose incident`, `propose incident
mem_fraction_static=0.88`, ...); messages are the same templates printed as text; buttons
become numbered choices. Only `--yes` approves without asking: it picks what kvpilot recommends
(the diagnosis's recommended proposal, then its approval) and says so. Without a terminal and
without `--yes` (cron, CI, `ssh host kvpilot console -c ...`) nobody can confirm, so the console
still runs what needs no choice but refuses at the first button, changes nothing, and exits
with status 2: a missing terminal must never stand for a yes.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

from bot.app.config import Config
from bot.app.identity import os_user
from bot.app.runtime import Runtime
from bot.chat.auth import CONSOLE_PREFIX, Principal
from bot.chat.campaign import KVPILOT
from bot.chat.messages import Button, Message
from bot.chat.surface import LOCAL_CHANNEL
from bot.chat.views import APPROVE, PROPOSE_OPTION
from bot.cli import exit_codes
from bot.console.identity import TERMINAL
from bot.console.text import plain, terminal_text
from storage import chat
from storage import proposals as proposal_store
from storage.chat import MessageRef
from storage.errors import NotFound

CHANNEL = LOCAL_CHANNEL
NO_TERMINAL = (
    "confirmation needed and there is no terminal: re-run in a terminal or with --yes to "
    "approve what kvpilot recommends"
)
EXIT_REFUSED = exit_codes.USAGE  # as `kvpilot experiment` without --yes or a terminal


class ConsoleSurface:
    """Prints messages; remembers the buttons of the latest messages for the prompt."""

    def __init__(self, out: TextIO, charts_dir: Path) -> None:
        self.channel = CHANNEL
        self.out = out
        self.charts_dir = charts_dir
        self.buttons: dict[str, tuple[Button, ...]] = {}
        self.saved: list[Path] = []
        self._n = 0
        self._lock = threading.Lock()

    def _print(self, text: str) -> None:
        with self._lock:
            self.out.write(text.rstrip("\n") + "\n")
            self.out.flush()

    def _show(self, ref: MessageRef, message: Message, edited: bool) -> None:
        body = terminal_text(message)
        if edited and len(body.splitlines()) <= 3:
            self._print("  " + body.replace("\n", "\n  "))
        else:
            self._print("\n" + body + "\n")
        with self._lock:
            if message.buttons:
                self.buttons[ref.message_id] = message.buttons
            else:
                self.buttons.pop(ref.message_id, None)

    def post(self, message: Message, *, thread: MessageRef | None = None) -> MessageRef:
        with self._lock:
            self._n += 1
            ref = MessageRef(CHANNEL, str(self._n), thread.message_id if thread else None)
        self._show(ref, message, edited=False)
        return ref

    def update(self, ref: MessageRef, message: Message) -> None:
        self._show(ref, message, edited=True)

    def progress(self, ref: MessageRef, message: Message) -> None:
        self.update(ref, message)  # printing never waits on anyone

    def upload(
        self, data: bytes, *, filename: str, title: str, thread: MessageRef | None = None
    ) -> None:
        self.charts_dir.mkdir(parents=True, exist_ok=True)
        path = self.charts_dir / filename
        path.write_bytes(data)
        self.saved.append(path)
        self._print(f"  [{title}: chart saved to {path}]")

    def whisper(self, who: Principal, message: Message) -> None:
        self._print("  (only you) " + terminal_text(message))

    def take_buttons(self) -> list[tuple[str, Button]]:
        with self._lock:
            items = [(message_id, b) for message_id, bs in self.buttons.items() for b in bs]
            self.buttons.clear()
        return items


class Console:
    """The terminal front end: one person's command loop over the shared `Runtime`.

    It differs from a chat service's front end where a foreground session must: the runtime
    runs without the deployment's duties (`duties=False`: scheduled reports, owed verdicts,
    proposal expiry, reminders and alerts speak in the chat's channels, and one claimed here
    would be marked sent into a terminal nobody else reads); experiments it resumes or starts
    are waited for, since each command runs in the foreground; Ctrl-C aborts them, each
    reverting its server, instead of leaving them for a next start (`interrupt`); and its end
    waits for its work (`Runtime.close`) rather than abandoning it (`Runtime.stop`).
    """

    def __init__(
        self,
        config: Config,
        *,
        out: TextIO,
        stdin: TextIO,
        auto: bool,
        can_ask: bool = True,
        err: TextIO = sys.stderr,
        user: str | None = None,
    ) -> None:
        """`auto`: choose what kvpilot recommends (`--yes`). Otherwise ask on `stdin`, or, when
        `can_ask` is false (no terminal), refuse every choice and set `refused`."""
        self.out = out
        self.err = err
        self.stdin = stdin
        self.auto = auto
        self.can_ask = can_ask
        self.refused = False
        name = user or os_user()
        self.who = Principal(CONSOLE_PREFIX + name, CHANNEL)
        self.surface = ConsoleSurface(out, Path(config.state_dir) / "charts")
        self.runtime = Runtime(
            config,
            surface_for=lambda _channel: self.surface,
            ids=TERMINAL,
            duties=False,
            progress_every_s=2.0,
        )
        self.clock = self.runtime.clock
        self.flow = self.runtime.flow

    def start_background(self) -> None:
        """Resume what a previous kvpilot left running (waited for: see the class) and sample
        the servers while the console runs (the reports are built from this)."""
        resumed = self.runtime.start()
        if resumed:
            self.say(f"resumed experiment(s) {resumed} left running by a previous kvpilot")
            self.flow.runner.join()

    def stop_background(self) -> None:
        self.runtime.close()

    def say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def run_command(self, line: str) -> None:
        reply = self.flow.command(self.who, line.removeprefix("/kvpilot").strip())
        if reply.now is not None:
            self.say(terminal_text(reply.now))
        if reply.work is not None:
            reply.work(self.surface)
        self.handle_buttons()
        self.flow.runner.join()

    def interrupt(self, name: str) -> None:
        """Ctrl-C or SIGTERM: abort the experiments running here (each reverts its server) and
        wait for the reverts; a further signal only says what is left."""

        def still(_signum: int, _frame: object) -> None:
            self.err.write(
                "\nthe revert is still under way and finishes by itself; if kvpilot is "
                "killed now, run `kvpilot resume` to finish it.\n"
            )
            self.err.flush()

        previous = {sig: signal.signal(sig, still) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            for exp_id in self.flow.runner.running():
                self.err.write(
                    f"\n{name}: aborting experiment {exp_id}: the server is put back on its "
                    "last-known-good configuration (a second Ctrl-C does not stop that).\n"
                )
                self.err.flush()
                self.flow.runner.abort(exp_id, actor=self.who.user)
            self.flow.runner.join()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_buttons(self) -> None:
        while True:
            items = self.surface.take_buttons()
            if not items:
                return
            if self.auto:
                chosen = self._auto_choice(items)
            elif self.can_ask:
                chosen = self._ask(items)
            else:
                self._refuse(items)
                return
            if chosen is None:
                return
            message_id, button = chosen
            reply = self.flow.action(
                self.who, button.action_id, button.value, MessageRef(CHANNEL, message_id)
            )
            if reply.now is not None:
                self.say(terminal_text(reply.now))
            if reply.work is not None:
                reply.work(self.surface)

    def _refuse(self, items: list[tuple[str, Button]]) -> None:
        """Nobody is there to confirm: leave every choice untaken and say how to make one."""
        self.refused = True
        self.say("> not chosen (no terminal): " + ", ".join(b.label for _, b in items))
        self.err.write(f"error: {NO_TERMINAL}\n")
        self.err.flush()

    def _auto_choice(self, items: list[tuple[str, Button]]) -> tuple[str, Button] | None:
        for message_id, b in items:
            if b.action_id.startswith(PROPOSE_OPTION) and self._recommended(b.value):
                self.say(f"> auto: {b.label} (the recommended change)")
                return message_id, b
            if b.action_id == APPROVE and self._proposed_by_kvpilot(b.value):
                # a verdict's next step: --yes approves the change asked for, not a campaign
                # without bounds (`kvpilot tune --allow ...` runs a bounded one)
                self.say("> auto: left for a person: kvpilot's next step after a verdict")
                continue
            if b.action_id == APPROVE:
                self.say("> auto: Approve (--yes approves what kvpilot recommends)")
                return message_id, b
        self.say("> auto: nothing recommended to act on")
        return None

    def _proposed_by_kvpilot(self, value: str) -> bool:
        try:
            row = proposal_store.get_proposal(self.flow.db(), int(value.partition(":")[0]))
        except (ValueError, NotFound):
            return False
        return row.created_by == KVPILOT

    def _recommended(self, value: str) -> bool:
        diag_id, _, index = value.partition(":")
        try:
            finding = chat.get_diagnosis(self.flow.db(), int(diag_id)).finding
            return bool(finding["options"][int(index)]["verdict"] == "recommended")
        except (NotFound, ValueError, IndexError, KeyError):
            return False

    def _ask(self, items: list[tuple[str, Button]]) -> tuple[str, Button] | None:
        for i, (_, b) in enumerate(items, 1):
            self.say(f"  [{i}] {b.label}")
        self.out.write("Choose a number (Enter to skip): ")
        self.out.flush()
        answer = self.stdin.readline().strip()
        if not answer.isdigit() or not 1 <= int(answer) <= len(items):
            return None
        message_id, b = items[int(answer) - 1]
        if b.confirm is not None:
            self.out.write(f"{b.confirm.title} {plain(b.confirm.text)} [y/N] ")
            self.out.flush()
            if self.stdin.readline().strip().lower() not in ("y", "yes"):
                self.say("  not done")
                return None
        return message_id, b

    def loop(self, commands: Iterable[str]) -> None:
        for line in commands:
            if self.refused:  # later commands may build on the choice that was not made
                return
            if line.strip():
                self.say(f"kvpilot> {line.strip()}")
                self.run_command(line)
        if self.refused or self.auto or not self.stdin.isatty():
            return
        self.say("Type a command (help lists them), or quit.")
        while True:
            self.out.write("kvpilot> ")
            self.out.flush()
            line = self.stdin.readline()
            if not line or line.strip() in ("quit", "exit"):
                return
            if line.strip():
                self.run_command(line)


def main(
    config: Config,
    commands: list[str],
    *,
    auto: bool,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """Exit status 2 when a choice was needed and nobody could make it (no terminal, no --yes)."""
    console = Console(
        config, out=out, err=err, stdin=sys.stdin, auto=auto, can_ask=sys.stdin.isatty()
    )
    received: list[str] = []

    def on_term(signum: int, _frame: object) -> None:
        received.append(signal.Signals(signum).name)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    code = 0
    try:
        console.start_background()
        console.loop(commands)
        code = EXIT_REFUSED if console.refused else 0
    except KeyboardInterrupt:
        console.interrupt(received[0] if received else "SIGINT")
        code = exit_codes.CANCELLED
    finally:
        signal.signal(signal.SIGTERM, previous)
        console.stop_background()
    return code
