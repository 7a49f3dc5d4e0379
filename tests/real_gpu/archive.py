"""The bundle as one deterministic `tar.xz`, its size check, and its safe extraction.

Deterministic: members in sorted order, owners, modes and times fixed, so the same staging
folder gives the same bytes (xz at a fixed preset is deterministic too). Python reads tar.xz
with the standard library everywhere, which is why the bundle is not zstd.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

# 2026-01-01T00:00:00Z: every member's modification time.
FIXED_MTIME = 1_767_225_600
MIB = 1 << 20


def sha256_of(path: Path) -> str:
    """The file's SHA-256, read in blocks (the bundle is 40 MiB, a wheel up to 400 MB)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _normalised(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = FIXED_MTIME
    executable = info.isdir() or bool(info.mode & 0o100)
    info.mode = 0o755 if executable else 0o644
    return info


def members(root: Path) -> list[Path]:
    """Every folder and file under `root`, parents before children, in a fixed order."""
    out: list[Path] = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        base = Path(folder)
        if base != root:
            out.append(base)
        out.extend(base / f for f in sorted(files))
    return out


def write_archive(
    root: Path,
    dest: Path,
    preset: int = 6,
    on_progress: Callable[[int, int], None] | None = None,
) -> int:
    """Pack everything under `root` into `dest` (written beside it, then renamed); its size."""
    paths = members(root)
    tmp = dest.with_name(dest.name + ".part")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with (
        lzma.open(tmp, "wb", format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=preset) as xz,
        tarfile.open(fileobj=xz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for i, path in enumerate(paths, 1):
            info = _normalised(tar.gettarinfo(str(path), path.relative_to(root).as_posix()))
            if info.isfile():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
            if on_progress is not None and (i % 2000 == 0 or i == len(paths)):
                on_progress(i, len(paths))
    tmp.replace(dest)
    return dest.stat().st_size


def size_problem(size: int, budget: int, biggest: list[tuple[str, int]]) -> str | None:
    """None when `size` fits `budget` (bytes); else what to say, with the largest parts."""
    if size <= budget:
        return None
    lines = [
        f"the bundle is {size / MIB:.1f} MiB, over its budget of {budget / MIB:.1f} MiB (a call "
        "to the GPU machine carries at most 64 MiB with the repository). Largest parts, "
        "unpacked:"
    ]
    lines.extend(f"  {name:40} {n / MIB:8.1f} MiB" for name, n in biggest)
    lines.append("Strip more (tests/real_gpu/stage.py, STRIP_RULES) or carry fewer packages.")
    return "\n".join(lines)


def extract(archive: Path, dest: Path) -> None:
    """Unpack `archive` into `dest` with tarfile's `data` filter (no links out, no devices)."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:xz") as tar:
        tar.extractall(dest, filter="data")
