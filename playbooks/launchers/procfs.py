"""What `/proc` says of a process: when it started, and which processes share its group.

The process launcher knows its server by pid and start time (a pid is reused once its process
is gone) and stops it as a process group (SGLang's scheduler and vLLM's EngineCore are
processes of their own). Linux only; where there is no `/proc`, each reader says None.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")


def after_name(stat: str) -> list[str]:
    """The fields of `/proc/PID/stat` from the third (the state) on. The command name (field
    2) may hold spaces and parentheses, so they count from its last ')'."""
    return stat.rpartition(")")[2].split()


def is_zombie(stat: str) -> bool:
    """The process has ended and waits for its parent to reap it."""
    return after_name(stat)[:1] == ["Z"]


def start_ticks(stat: str) -> int | None:
    """Field 22 of `/proc/PID/stat`: when the process started, in clock ticks since boot."""
    fields = after_name(stat)
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def process_start_ticks(pid: int) -> int | None:
    """The start of the process now holding `pid`, or None (gone, or no /proc on this host)."""
    try:
        return start_ticks((PROC / str(pid) / "stat").read_text())
    except OSError:
        return None


def group_members(pgid: int) -> list[int] | None:
    """The pids of process group `pgid` that run (zombies left out), or None without /proc."""
    try:
        entries = os.listdir(PROC)
    except OSError:
        return None
    found: list[int] = []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            fields = after_name((PROC / entry / "stat").read_text())
        except OSError:
            continue  # ended while listed
        if len(fields) > 2 and fields[0] != "Z" and fields[2] == str(pgid):
            found.append(int(entry))
    return found


def started_wall(ticks: int) -> float | None:
    """A start in ticks as wall-clock time, for state files written before ticks were kept."""
    try:
        for line in (PROC / "stat").read_text().splitlines():
            if line.startswith("btime "):
                return int(line.split()[1]) + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None
    return None
