"""The bundle's staging folder: wheels unpacked (not installed), trimmed, stand-ins added.

A wheel is a zip whose members go straight into site-packages, so unpacking one into a folder
that is put on PYTHONPATH is what installing it amounts to here: the target is the GPU image's
Python 3.12, and this machine's Python cannot install for it. What is dropped is listed in
STRIP_RULES with the reason; everything else of each wheel is kept, its metadata included
(transformers and SGLang read other packages' versions from it).
"""

from __future__ import annotations

import fnmatch
import shutil
import stat
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

STAND_INS_DIR = Path(__file__).resolve().parent / "standins"

# (pattern over the path inside site-packages, why it is dropped); fnmatch patterns, `*`
# crossing folders. sglang-kernel 0.4.5 is a 383 MB wheel: what a Hopper GPU needs of it with the
# triton attention backend is sgl_kernel/sm90/common_ops.abi3.so (18.6 MB) and the Python files.
STRIP_RULES: tuple[tuple[str, str], ...] = (
    ("sgl_kernel/flash_ops.abi3.so", "FlashAttention-3 (1.1 GB); the triton backend is used"),
    ("sgl_kernel/flashmla_ops.abi3.so", "FlashMLA, for MLA models (DeepSeek)"),
    ("sgl_kernel/infllm_ops*.so", "InfLLM-V2 sparse attention"),
    ("sgl_kernel/sm100/*", "Blackwell (sm100) kernels; the GPU is a Hopper (sm90)"),
    ("xgrammar/lib/libxgrammar.a", "a static library (65 MB), for linking only"),
    ("sglang/srt/server/_core*.so", "the Rust router, not started"),
    ("sglang/srt/grpc/_core*.so", "the gRPC front end, not started"),
    ("sglang/srt/multimodal/_core*.so", "multimodal preprocessing; the model is text only"),
    ("*/__pycache__/*", "bytecode, written again where the bundle runs"),
    ("*.pyc", "bytecode, written again where the bundle runs"),
)


def strip_reason(path: str) -> str | None:
    """Why `path` (relative, `/`-separated) is left out of the bundle, or None to keep it."""
    for pattern, reason in STRIP_RULES:
        if fnmatch.fnmatchcase(path, pattern):
            return reason
    return None


@dataclass
class Unpacked:
    kept: int = 0
    kept_bytes: int = 0
    stripped: int = 0
    stripped_bytes: int = 0


def unpack_wheel(wheel: Path, site: Path, tally: Unpacked) -> None:
    """Extract `wheel` into `site`, leaving out what STRIP_RULES names; executable bits kept."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            name = info.filename
            if name.startswith("/") or ".." in Path(name).parts:
                raise ValueError(f"{wheel.name}: unsafe member path {name!r}")
            if strip_reason(name) is not None:
                tally.stripped += 1
                tally.stripped_bytes += info.file_size
                continue
            target = site / name
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, target.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            mode = (info.external_attr >> 16) & 0o777
            target.chmod(0o755 if mode & stat.S_IXUSR else 0o644)
            tally.kept += 1
            tally.kept_bytes += info.file_size


def write_stand_ins(site: Path, names: Iterable[str]) -> list[str]:
    """Copy the stand-in modules `names` (packages or single files) into `site`; the paths
    written, relative to `site`."""
    written: list[str] = []
    for name in names:
        if (site / name).exists() or (site / f"{name}.py").exists():
            raise FileExistsError(
                f"the bundle carries {name} itself: drop its stand-in from STAND_INS"
            )
        package, module = STAND_INS_DIR / name, STAND_INS_DIR / f"{name}.py"
        if package.is_dir():
            for src in sorted(package.rglob("*.py")):
                rel = src.relative_to(STAND_INS_DIR)
                (site / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, site / rel)
                written.append(rel.as_posix())
        elif module.is_file():
            shutil.copyfile(module, site / module.name)
            written.append(module.name)
        else:
            raise FileNotFoundError(f"no stand-in named {name} under {STAND_INS_DIR}")
    return written


def sizes_by_top_level(root: Path) -> dict[str, int]:
    """Bytes under each top-level entry of `root` (a package folder, a module, dist-info)."""
    totals: dict[str, int] = {}
    for path in root.rglob("*"):
        if path.is_file():
            top = path.relative_to(root).parts[0]
            totals[top] = totals.get(top, 0) + path.stat().st_size
    return totals


def largest(sizes: dict[str, int], n: int = 10) -> list[tuple[str, int]]:
    """The `n` largest entries, largest first (ties by name)."""
    return sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
