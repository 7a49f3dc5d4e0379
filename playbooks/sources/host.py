"""Host RAM for the hierarchical cache's budget: /proc/meminfo, the memory cgroup, or configured.

Host RAM, for the hierarchical cache's budget: read from /proc/meminfo and the container's
memory cgroup, or configured.

A container sees the whole machine in /proc/meminfo, but its memory cgroup is what the kernel
enforces: pinning more than the cgroup allows gets the server killed however much the host has
free. So the local reader bounds MemAvailable by the cgroup's headroom (v2 `memory.max` and
`memory.high` less `memory.current`; v1 `memory.limit_in_bytes` less `memory.usage_in_bytes`),
as SGLang 0.5.21 and later do (`python/sglang/srt/mem_cache/host_memory.py`,
`_cgroup_memory_headroom`, used by `available_host_memory_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Protocol

KIB = 1024
GIB = 1 << 30
# cgroup v1 writes "no limit" as PAGE_COUNTER_MAX rounded to a page (9223372036854771712).
NO_LIMIT_BYTES = 1 << 62
# Page-cache counters in memory.stat: reclaimable, so SGLang (like MemAvailable) counts them free.
V2_FILE_PAGES = ("active_file", "inactive_file")
V1_FILE_PAGES = ("total_active_file", "total_inactive_file")


class HostUnavailable(Exception):
    pass


@dataclass(frozen=True)
class HostMemory:
    total_bytes: int
    available_bytes: int
    source: str  # where the numbers came from, for the report
    container_limited: bool = False  # a cgroup limit, not the host, set `available_bytes`

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB

    @property
    def available_gib(self) -> float:
        return self.available_bytes / GIB


@dataclass(frozen=True)
class CgroupLimit:
    """The tightest memory limit over the process's cgroup and its ancestors."""

    limit_bytes: int
    usage_bytes: int  # charged to the cgroup, less reclaimable page cache
    source: str  # the file that set the limit

    @property
    def headroom_bytes(self) -> int:
        return max(0, self.limit_bytes - self.usage_bytes)


class HostReader(Protocol):
    def memory(self) -> HostMemory: ...


class CgroupReader:
    """The memory cgroup this process belongs to, v2 (unified) or v1, from files.

    `root` is where the cgroup filesystems are mounted and `membership` the process's
    /proc/self/cgroup; both are injectable so tests give a directory of their own.
    """

    def __init__(
        self,
        root: Path = Path("/sys/fs/cgroup"),
        membership: Path = Path("/proc/self/cgroup"),
    ) -> None:
        self.root = root
        self.membership = membership

    def limit(self) -> CgroupLimit | None:
        """None where no cgroup limits memory ("max", v1's no-limit value, or no cgroup)."""
        v2_path, v1_path = self._memberships()
        found = [
            *(_walk_limits(base, v2_path, V2) for base in self._v2_bases()),
            *(_walk_limits(base, v1_path, V1) for base in self._v1_bases()),
        ]
        limits = [limit for limit in found if limit is not None]
        return min(limits, key=lambda x: x.headroom_bytes) if limits else None

    def _memberships(self) -> tuple[PurePosixPath, PurePosixPath]:
        v2, v1 = PurePosixPath("/"), PurePosixPath("/")
        try:
            text = self.membership.read_text()
        except OSError:
            return v2, v1
        for line in text.splitlines():
            _, controllers, path = [*line.split(":", 2), "", ""][:3]
            if not controllers:
                v2 = PurePosixPath(path or "/")
            elif "memory" in controllers.split(","):
                v1 = PurePosixPath(path or "/")
        return v2, v1

    def _v2_bases(self) -> list[Path]:
        bases = (self.root, self.root / "unified")
        return [base for base in bases if (base / "cgroup.controllers").is_file()]

    def _v1_bases(self) -> list[Path]:
        bases = (self.root / "memory", self.root)
        return [base for base in bases if (base / "memory.limit_in_bytes").is_file()][:1]


@dataclass(frozen=True)
class _Layout:
    limits: tuple[str, ...]
    usage: str
    file_pages: tuple[str, ...]


V2 = _Layout(("memory.max", "memory.high"), "memory.current", V2_FILE_PAGES)
V1 = _Layout(("memory.limit_in_bytes",), "memory.usage_in_bytes", V1_FILE_PAGES)


def _walk_limits(base: Path, membership: PurePosixPath, layout: _Layout) -> CgroupLimit | None:
    """The tightest limit from the process's own cgroup up to the mount's root.

    Inside a cgroup namespace the membership path may not exist under the mount (the mount
    is the container's own cgroup); then the mount's root is the process's cgroup.
    """
    inside = membership.is_absolute() and ".." not in membership.parts
    directory = base / membership.relative_to("/") if inside else base
    if not directory.is_dir():
        directory = base
    best: CgroupLimit | None = None
    while True:
        for limit in _limits_in(directory, layout):
            if best is None or limit.headroom_bytes < best.headroom_bytes:
                best = limit
        if directory == base:
            return best
        directory = directory.parent


def _limits_in(directory: Path, layout: _Layout) -> list[CgroupLimit]:
    found = []
    for name in layout.limits:
        value = _read(directory / name)
        if value is None or not value.isdigit() or int(value) >= NO_LIMIT_BYTES:
            continue  # absent, "max" or v1's no-limit value
        usage = _read(directory / layout.usage)
        if usage is None or not usage.isdigit():  # a known limit, unknown usage: do not guess
            raise HostUnavailable(f"{directory / name} is set but {layout.usage} is unreadable")
        page_cache = _file_pages(directory / "memory.stat", layout.file_pages)
        charged = max(0, int(usage) - page_cache)
        found.append(CgroupLimit(int(value), charged, str(directory / name)))
    return found


def _file_pages(stat: Path, keys: tuple[str, ...]) -> int:
    text = _read(stat) or ""
    values = dict(line.split()[:2] for line in text.splitlines() if len(line.split()) >= 2)
    return sum(int(values[key]) for key in keys if values.get(key, "").isdigit())


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def bounded_by(mem: HostMemory, limit: CgroupLimit | None) -> HostMemory:
    """The host's memory as a process in that cgroup may use it: the smaller of the two."""
    if limit is None or (
        limit.limit_bytes >= mem.total_bytes and limit.headroom_bytes >= mem.available_bytes
    ):
        return mem
    return replace(
        mem,
        total_bytes=min(mem.total_bytes, limit.limit_bytes),
        available_bytes=min(mem.available_bytes, limit.headroom_bytes),
        source=f"{mem.source}, bounded by the container's {limit.source}",
        container_limited=limit.headroom_bytes < mem.available_bytes,
    )


class MeminfoReader:
    """The local host (the bot runs on the GPU host): /proc/meminfo, bounded by its cgroup."""

    def __init__(
        self, path: Path = Path("/proc/meminfo"), cgroup: CgroupReader | None = None
    ) -> None:
        self.path = path
        self.cgroup = cgroup or CgroupReader()

    def memory(self) -> HostMemory:
        try:
            text = self.path.read_text()
        except OSError as exc:
            raise HostUnavailable(f"cannot read {self.path}: {exc}") from exc
        return bounded_by(parse_meminfo(text, source=str(self.path)), self.cgroup.limit())


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
