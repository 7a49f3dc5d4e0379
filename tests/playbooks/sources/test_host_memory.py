"""Host RAM as the container may use it: /proc/meminfo bounded by the memory cgroup (v1, v2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from playbooks.sources.host import GIB, CgroupReader, HostUnavailable, MeminfoReader

MEMINFO = "MemTotal:       263921664 kB\nMemFree:        1000 kB\nMemAvailable:   251658240 kB\n"
HOST_TOTAL, HOST_AVAILABLE = 263921664 * 1024, 251658240 * 1024  # ~251.7 and 240 GiB
MEMBERSHIP_V2 = "0::/kubepods/pod1/ctr\n"
MEMBERSHIP_V1 = "12:memory:/docker/ctr\n11:cpu,cpuacct:/docker/ctr\n0::/\n"


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def reader(tmp_path: Path, membership: str, files: dict[str, str]) -> MeminfoReader:
    (tmp_path / "meminfo").write_text(MEMINFO)
    (tmp_path / "cgroup").write_text(membership)
    write(tmp_path / "fs", files)
    cgroup = CgroupReader(root=tmp_path / "fs", membership=tmp_path / "cgroup")
    return MeminfoReader(tmp_path / "meminfo", cgroup)


V2_CTR = "kubepods/pod1/ctr"
# membership, cgroup files, expected (total GiB, available GiB, bounded by the container)
CASES = [
    ("no cgroup files", MEMBERSHIP_V2, {}, (HOST_TOTAL / GIB, 240.0, False)),
    (
        "v2 max: no limit",
        MEMBERSHIP_V2,
        {"cgroup.controllers": "memory", f"{V2_CTR}/memory.max": "max\n"},
        (HOST_TOTAL / GIB, 240.0, False),
    ),
    (
        "v2 memory.max less memory.current",
        MEMBERSHIP_V2,
        {
            "cgroup.controllers": "memory",
            f"{V2_CTR}/memory.max": f"{64 * GIB}\n",
            f"{V2_CTR}/memory.high": "max\n",
            f"{V2_CTR}/memory.current": f"{16 * GIB}\n",
        },
        (64.0, 48.0, True),
    ),
    (
        "v2 memory.high below memory.max; page cache counts as free",
        MEMBERSHIP_V2,
        {
            "cgroup.controllers": "memory",
            f"{V2_CTR}/memory.max": f"{64 * GIB}\n",
            f"{V2_CTR}/memory.high": f"{40 * GIB}\n",
            f"{V2_CTR}/memory.current": f"{16 * GIB}\n",
            f"{V2_CTR}/memory.stat": f"anon 1\nactive_file {4 * GIB}\ninactive_file {4 * GIB}\n",
        },
        (40.0, 32.0, True),
    ),
    (
        "v2 a parent's limit is tighter than the container's",
        MEMBERSHIP_V2,
        {
            "cgroup.controllers": "memory",
            "kubepods/pod1/memory.max": f"{32 * GIB}\n",
            "kubepods/pod1/memory.current": f"{8 * GIB}\n",
            f"{V2_CTR}/memory.max": "max\n",
        },
        (32.0, 24.0, True),
    ),
    (
        "v2 inside a cgroup namespace: the mount is the container",
        "0::/\n",
        {
            "cgroup.controllers": "memory",
            "memory.max": f"{100 * GIB}\n",
            "memory.current": f"{10 * GIB}\n",
        },
        (100.0, 90.0, True),
    ),
    (
        "v1 limit less usage, less total_*_file",
        MEMBERSHIP_V1,
        {
            "memory/memory.limit_in_bytes": "9223372036854771712\n",
            "memory/docker/ctr/memory.limit_in_bytes": f"{80 * GIB}\n",
            "memory/docker/ctr/memory.usage_in_bytes": f"{30 * GIB}\n",
            "memory/docker/ctr/memory.stat": f"total_inactive_file {10 * GIB}\n",
        },
        (80.0, 60.0, True),
    ),
    (
        "v1 no limit (PAGE_COUNTER_MAX)",
        MEMBERSHIP_V1,
        {
            "memory/memory.limit_in_bytes": "9223372036854771712\n",
            "memory/docker/ctr/memory.limit_in_bytes": "9223372036854771712\n",
            "memory/docker/ctr/memory.usage_in_bytes": f"{30 * GIB}\n",
        },
        (HOST_TOTAL / GIB, 240.0, False),
    ),
    (
        "a limit larger than the host bounds nothing",
        MEMBERSHIP_V2,
        {
            "cgroup.controllers": "memory",
            f"{V2_CTR}/memory.max": f"{1024 * GIB}\n",
            f"{V2_CTR}/memory.current": f"{1 * GIB}\n",
        },
        (HOST_TOTAL / GIB, 240.0, False),
    ),
]


@pytest.mark.parametrize(
    ("membership", "files", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_host_memory_is_bounded_by_the_cgroup(
    tmp_path: Path, membership: str, files: dict[str, str], expected: tuple[float, float, bool]
) -> None:
    mem = reader(tmp_path, membership, files).memory()
    total, available, limited = expected
    assert (round(mem.total_gib, 1), round(mem.available_gib, 1)) == (round(total, 1), available)
    assert mem.container_limited is limited
    assert ("bounded by the container" in mem.source) is (total < HOST_TOTAL / GIB)


def test_a_limit_with_unreadable_usage_is_not_guessed(tmp_path: Path) -> None:
    files = {"cgroup.controllers": "memory", f"{V2_CTR}/memory.max": f"{64 * GIB}\n"}
    with pytest.raises(HostUnavailable, match=r"memory\.current"):
        reader(tmp_path, MEMBERSHIP_V2, files).memory()
