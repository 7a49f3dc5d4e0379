"""A `kvpilot experiment` in a process of its own, paused at a state so that a test can break
something around it, then let go; its stderr collected line by line."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from tests.faults.entry import FAULTY_CLI
from tests.twin_process import REPO


class BotProcess:
    def __init__(
        self,
        config: Path,
        server: str,
        change: str,
        pause_before: str,
        tmp: Path,
    ):
        self.marker = tmp / f"paused-{pause_before}"
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [
                *FAULTY_CLI,
                *("experiment", "--server", server),
                *("--set", change, "--yes", "--json", "--config", str(config)),
            ],
            cwd=REPO,
            env={
                **os.environ,
                "KVPILOT_FAULT_PAUSE_BEFORE": pause_before,
                "KVPILOT_FAULT_MARKER": str(self.marker),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)

    def paused(self, timeout_s: float = 180) -> None:
        """Wait until the process stopped before its state's first step."""
        deadline = time.monotonic() + timeout_s
        while not self.marker.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"the bot never paused: {self.stderr[-3000:]}")
            time.sleep(0.05)

    def go_on(self) -> None:
        self.marker.unlink()

    def wait_for(self, text: str, timeout_s: float = 120, *, times: int = 1) -> None:
        """Until `text` was in `times` lines of the process's stderr."""
        deadline = time.monotonic() + timeout_s
        while sum(text in line for line in list(self.lines)) < times:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the bot never said {text!r}: {self.stderr[-3000:]}")
            time.sleep(0.05)

    def finish(self, timeout_s: float = 300) -> tuple[int, dict[str, Any] | None]:
        """The exit status and the JSON result, if it printed one."""
        try:
            self.proc.wait(timeout=timeout_s)  # its JSON comes at the end: the pipe holds it
            assert self.proc.stdout is not None
            out = self.proc.stdout.read()
            self._reader.join(timeout=10)
        finally:
            self.kill()
        result = json.loads(out) if out.strip() else None
        return self.proc.returncode, result

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
