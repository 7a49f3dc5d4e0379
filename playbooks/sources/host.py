"""Host RAM, for the hierarchical cache's budget: read from /proc/meminfo or configured."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

KIB = 1024
GIB = 1 << 30


class HostUnavailable(Exception):
    pass


@dataclass(frozen=True)
class HostMemory:
    total_bytes: int
    available_bytes: int
    source: str  # where the numbers came from, for the report

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB

    @property
    def available_gib(self) -> float:
        return self.available_bytes / GIB


class HostReader(Protocol):
    def memory(self) -> HostMemory: ...


class MeminfoReader:
    """The local host (the bot runs on the GPU host), from /proc/meminfo."""

    def __init__(self, path: Path = Path("/proc/meminfo")) -> None:
        self.path = path

    def memory(self) -> HostMemory:
        try:
            text = self.path.read_text()
        except OSError as exc:
            raise HostUnavailable(f"cannot read {self.path}: {exc}") from exc
        return parse_meminfo(text, source=str(self.path))


class ConfiguredHost:
    """A remote GPU host whose RAM the operator states in configuration (GiB)."""

    def __init__(self, total_gib: float, available_gib: float | None = None) -> None:
        if total_gib <= 0:
            raise ValueError(f"host RAM must be positive, got {total_gib} GiB")
        self.total_gib = total_gib
        self.available_gib = available_gib if available_gib is not None else total_gib

    def memory(self) -> HostMemory:
        return HostMemory(int(self.total_gib * GIB), int(self.available_gib * GIB), "configuration")


def parse_meminfo(text: str, source: str = "/proc/meminfo") -> HostMemory:
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key.strip()] = int(parts[0]) * (KIB if parts[1:2] == ["kB"] else 1)
    if "MemTotal" not in values:
        raise HostUnavailable(f"{source} has no MemTotal line")
    available = values.get("MemAvailable", values.get("MemFree", 0))
    return HostMemory(values["MemTotal"], available, source)
