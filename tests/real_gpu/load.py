"""The closed-loop clients of a phase: `python -m sim.load` in its own process, kept on until the
phase stops it (SIGTERM ends it with its report and its timeline of finished requests)."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

from tests.real_gpu.commands import PROFILE, load_command
from tests.real_gpu.server import Machine


class Load:
    def __init__(self, proc: subprocess.Popen[bytes], out: Path, err: Path) -> None:
        self.proc, self.out, self.err = proc, out, err

    @classmethod
    def start(
        cls,
        machine: Machine,
        url: str,
        clients: int,
        cwd: Path,
        profile: str = PROFILE,
        options: tuple[str, ...] = (),
    ) -> Load:
        cwd.mkdir(parents=True, exist_ok=True)  # a call's first phase may be this one
        out = machine.log_path("load-report").with_suffix(".json")
        err = machine.log_path("load")
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = subprocess.Popen(
                load_command(machine.python, url, clients, profile, options),
                stdout=stdout,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
                env=machine.tool_env,
                cwd=cwd,
            )
        return cls(proc, out, err)

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """End the load; its report (with `finished`), or what went wrong."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        text = self.out.read_text() if self.out.exists() else ""
        try:
            report = json.loads(text.strip().splitlines()[-1]) if text.strip() else {}
        except ValueError:
            report = {}
        if not isinstance(report, dict) or "completed" not in report:
            tail = self.err.read_text()[-2000:] if self.err.exists() else ""
            return {"error": f"the load generator exited {self.proc.returncode}: {tail}"}
        return report
