"""Real file-system faults for tests: a size-limited tmpfs that fills up, a read-only bind mount.

Made with mount(8), as root (CI runs as root); never by chmod, which root ignores. Each is
undone when its block ends, lazily if a process still holds a file there, so a failing test
leaves no mount behind.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

CAN_MOUNT = os.geteuid() == 0 and shutil.which("mount") is not None

needs_mount = pytest.mark.skipif(
    not CAN_MOUNT and not os.environ.get("CI"),
    reason="mounting a tmpfs or a read-only bind mount needs root (CI runs as root)",
)


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"mount {' '.join(args)}: {done.stderr.strip()}")


def _umount(path: Path) -> None:
    done = subprocess.run(["umount", str(path)], capture_output=True, check=False)
    if done.returncode != 0:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


@contextmanager
def tmpfs(path: Path, size_kib: int) -> Iterator[Path]:
    """A tmpfs of `size_kib` KiB mounted at `path` (created): a disk that can be filled."""
    path.mkdir(parents=True, exist_ok=True)
    _mount("-t", "tmpfs", "-o", f"size={size_kib}k,mode=0755", "tmpfs", str(path))
    try:
        yield path
    finally:
        _umount(path)


@contextmanager
def read_only(path: Path) -> Iterator[Path]:
    """`path` bind-mounted read-only onto itself (no process may hold a file there open for
    writing: the kernel refuses to make such a mount read-only)."""
    _mount("--bind", str(path), str(path))
    try:
        _mount("-o", "remount,bind,ro", str(path))
        yield path
    finally:
        _umount(path)


def fill(directory: Path) -> Path:
    """Write a file in `directory` until its file system is full; the file, to delete later."""
    filler = directory / "filler"
    chunk = b"\0" * 65536
    with filler.open("wb", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    with suppress(OSError), filler.open("ab", buffering=0) as f:  # the last partial block
        for _ in range(64):
            f.write(b"\0" * 1024)
    return filler
