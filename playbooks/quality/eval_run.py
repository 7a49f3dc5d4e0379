"""The eval command's runner: `python -m playbooks.quality.eval_run STATUS TIMEOUT_S CWD -- ARGV`.

kvpilot starts this runner in its own session and looks for STATUS at each step, so the
command's run outlives a bot that dies meanwhile, and the bot that resumes the experiment reads
how it ended instead of running it twice. The runner starts ARGV in CWD (its own process group,
stdin closed, output to STATUS.log), kills the group at TIMEOUT_S, and writes STATUS (JSON:
exit_code, timed_out, error, tail, seconds) atomically once the command has ended.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TAIL_BYTES = 4000


def run(status: Path, timeout_s: float, cwd: str, argv: list[str]) -> dict[str, object]:
    """Run `argv` to its end or its timeout; what STATUS will hold."""
    log = status.with_name(status.name + ".log")
    started = time.monotonic()
    result: dict[str, object] = {"exit_code": None, "timed_out": False, "error": "", "tail": ""}
    with log.open("wb") as out:
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            result["error"] = str(exc)
            return {**result, "seconds": time.monotonic() - started}
        try:
            result["exit_code"] = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            result["timed_out"] = True
    with log.open("rb") as out:
        out.seek(max(0, log.stat().st_size - TAIL_BYTES))
        result["tail"] = out.read().decode("utf-8", "replace")
    log.unlink(missing_ok=True)
    return {**result, "seconds": time.monotonic() - started}


def write_status(status: Path, result: dict[str, object]) -> None:
    """STATUS appears whole or not at all (a reader never sees half of it)."""
    partial = status.with_name(status.name + ".partial")
    partial.write_text(json.dumps(result))
    os.replace(partial, status)


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[3] != "--":
        sys.stderr.write(__doc__ or "")
        return 2
    status, timeout_s, cwd, argv = Path(argv[0]), float(argv[1]), argv[2], argv[4:]
    write_status(status, run(status, timeout_s, cwd, argv))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
