"""Run a kvpilot entry point with the crash tests' step faults installed.

    python -m tests.faults.entry bot.cli experiment --server incident ...

The product has no fault injection: the experiment's steps accept watchers
(`playbooks.experiments.advance.watch_steps`), and this entry installs one that reads

    KVPILOT_FAULT_PAUSE_BEFORE=<state>  stop dead before the first step in `state`, touching
                                        KVPILOT_FAULT_MARKER=<file> when the pause begins, until
                                        the test removes the marker (having broken something
                                        meanwhile) or kills the process; once
    KVPILOT_FAULT_KILL_AFTER=<state>:<step>
                                        SIGKILL this process right after it took `step` (scrape,
                                        issue, poll, look, move, ...) in `state`

then runs the named module as `python -m` would. A pause without a marker is refused at once
(it could never end).
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import time
from pathlib import Path

from playbooks.experiments.advance import AFTER, BEFORE, watch_steps
from storage.experiments import State

# `python -m bot.cli` with the faults installed, for the tests' command lines
FAULTY_CLI = (sys.executable, "-m", "tests.faults.entry", "bot.cli")


class Faults:
    def __init__(self, env: dict[str, str]) -> None:
        self.pause_before = env.get("KVPILOT_FAULT_PAUSE_BEFORE")
        self.marker = env.get("KVPILOT_FAULT_MARKER")
        self.kill_after = env.get("KVPILOT_FAULT_KILL_AFTER")
        if self.pause_before and not self.marker:
            raise SystemExit("KVPILOT_FAULT_PAUSE_BEFORE needs KVPILOT_FAULT_MARKER to end")

    def __call__(self, when: str, state: State, step: str) -> None:
        if when == BEFORE and self.pause_before == str(state) and self.marker:
            self.pause_before = None  # once
            marker = Path(self.marker)
            marker.touch()
            while marker.exists():
                time.sleep(0.05)
        if when == AFTER and self.kill_after == f"{state}:{step}":
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m tests.faults.entry MODULE [ARGS ...]")
    watch_steps(Faults(dict(os.environ)))
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
