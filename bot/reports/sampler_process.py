"""The sampler in a process of its own, for a fleet.

A bot is one Python process, and its threads share one interpreter lock. At 500 servers the
sampler's threads (scraping, parsing, storing) took that lock so often that the threads
answering Slack waited for it: commands were acknowledged after 3.5 s at the 99th percentile
(some after Slack's 3 s, which Slack shows as a failure), against 104 ms with the sampler off,
while the bot used a third of its core (BENCHMARKS.md, One bot for a fleet). In a process of its
own the sampler has its own lock, and the kernel shares the core between the two fairly.

`SamplerProcess` starts `python -m bot.reports.sampler_process --config PATH`, which runs the
same `Sampler` in that process and writes one line of JSON after each round (the servers'
states, `sampler_state.wire`); the bot answers `status`, `/healthz` and its own metrics from the
newest line as it would from a sampler in its thread. The process stops when its standard input
closes (the bot stopped, or died: it never outlives the bot); when it exits on its own the bot
starts it again after `RESTART_S`. Both processes write the one database: SQLite's write-ahead
log and busy timeout let them, and the sampler builds each round on what is stored, not on what
it remembers (`Sampler._prepare`).

At the wall clock's pace only: a bot against an accelerated twin (`[kvpilot] time_scale`) keeps
one clock continued from the database (`bot.app.wiring.make_clock`), which a second process
would start afresh, so such a bot samples in its thread (`samples_in_a_process`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from bot.app import logs
from bot.app.config import Config, load
from bot.app.config.schedule import PROCESS_FROM_SERVERS
from bot.app.wiring import make_clock
from bot.reports.sampler import Sampler
from bot.reports.sampler_state import SamplerStatus, from_wire, wire
from playbooks.clock import Clock
from storage.db import open_db

log = logging.getLogger(__name__)
RESTART_S = 5.0  # wall seconds before a sampler process that exited is started again
STOP_S = 10.0  # how long a stop waits for the process to finish its round


def samples_in_a_process(config: Config) -> bool:
    """`[sampler] process`: true, false, or (unset, "auto") from `PROCESS_FROM_SERVERS`
    servers; never against an accelerated twin (see the module's docstring)."""
    wanted = config.sampler.process
    if wanted is None:
        wanted = len(config.servers) >= PROCESS_FROM_SERVERS
    if wanted and config.time_scale != 1.0:
        log.warning(
            "[sampler] process: sampling in a thread of the bot, not a process of its own, "
            "because [kvpilot] time_scale = %g keeps one clock for the whole bot",
            config.time_scale,
        )
        return False
    return wanted and config.sampler.enabled


class SamplerProcess(SamplerStatus):
    """Runs the sampler's process and shows its rounds as a sampler in a thread shows its own."""

    def __init__(
        self,
        config: Config,
        clock: Clock,
        *,
        command: Sequence[str] | None = None,
        restart_s: float = RESTART_S,
    ) -> None:
        super().__init__(config, clock)
        self.command = list(command or child_command(config))
        self.restart_s = restart_s
        self.exits = 0  # times the process exited while it should have run
        self._proc: subprocess.Popen[str] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is not None or not self.config.sampler.enabled:
            return
        self._stop.clear()
        self.started_mono = time.monotonic()
        self._thread = threading.Thread(
            target=self._supervise, name="kvpilot-sampler-process", daemon=True
        )
        self._thread.start()

    def _supervise(self) -> None:
        while not self._stop.is_set():
            with subprocess.Popen(
                self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            ) as proc:
                self._proc = proc
                assert proc.stdout is not None
                for line in proc.stdout:
                    self._round(line)
            code = proc.wait()
            if self._stop.is_set():
                return
            self.exits += 1
            log.error(
                "the sampler's process exited (code %s); starting it again in %g s",
                code,
                self.restart_s,
            )
            self._stop.wait(self.restart_s)

    def _round(self, line: str) -> None:
        """One round's line: every configured server's state (a server it lacks, or a state
        that is not one, makes it no round; servers it has beyond the configuration are
        ignored)."""
        try:
            servers = json.loads(line)["servers"]
            states = {
                name: from_wire(name, servers[name], self.interval_s)
                for name in self.config.servers
            }
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("the sampler's process wrote a line that is not a round: %.200r", line)
            return
        self.states = states
        self.last_round_mono = time.monotonic()

    @property
    def running(self) -> bool:
        proc = self._proc
        return proc is not None and proc.poll() is None and not self._stop.is_set()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def where(self) -> str:
        return f" in process {self.pid}" if self.running else ""

    def stop(self, timeout: float = STOP_S) -> None:
        """Close the process's input (it ends its round and exits), then wait for it."""
        self._stop.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            assert proc.stdin is not None
            proc.stdin.close()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("the sampler's process did not stop in %g s; killing it", timeout)
                proc.kill()
                proc.wait()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None


def child_command(config: Config) -> list[str]:
    """The sampler's process, logging as this process logs."""
    module = [sys.executable, "-m", "bot.reports.sampler_process"]
    return [*module, "--config", str(config.path), *logs.as_configured()]


def main(argv: Sequence[str] | None = None) -> int:
    """The sampler's process: sample until standard input closes, a line after each round."""
    parser = argparse.ArgumentParser(prog="python -m bot.reports.sampler_process")
    parser.add_argument("--config", required=True, help="the bot's configuration file")
    parser.add_argument("--log-level", default="WARNING", help="as the bot's (logs.configure)")
    parser.add_argument("--log-json", action="store_true", help="JSON lines, as the bot's")
    ns = parser.parse_args(argv)
    config = load(ns.config)
    logs.configure(ns.log_level, json=ns.log_json, secrets=logs.config_secrets(config))
    db = open_db(config.database)
    sampler = Sampler(config, db, make_clock(config, db))
    gone = threading.Event()

    def tell() -> None:
        if gone.is_set():
            return
        try:
            sys.stdout.write(json.dumps({"servers": wire(sampler.states)}) + "\n")
            sys.stdout.flush()
        except OSError:  # the bot is gone; the read below ends too
            gone.set()

    sampler.on_round = tell
    sampler.start()
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C reaches the whole process group
        sys.stdin.read()  # until the bot closes it, or dies
    gone.set()
    sampler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
