"""The GPU machine's side before any phase: the bundle unpacked, the environment, early checks.

Standard library only (and the GPU image's pynvml, read lazily), so that it runs before the
bundle is unpacked and tells at once, in one line each, what is missing: the wrong python, no
GPU, no bundle, no `libnvrtc.so.13`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.real_gpu import archive, image

BUNDLE_NAME = "kvpilot-gpu-bundle.tar.xz"
CACHE_NAME = "jit-cache.tar.xz"
NVRTC = "libnvrtc.so.13"
COMPLETE = ".complete"
# SGLang's and its libraries' compile caches, under one folder carried between calls.
CACHE_VARIABLES = {
    "TVM_FFI_CACHE_DIR": "tvm-ffi",  # sglang's JIT kernels (tvm_ffi.cpp.load_inline)
    "TRITON_CACHE_DIR": "triton",
    "SGLANG_CACHE_DIR": "sglang",
    "SGLANG_DG_CACHE_DIR": "deep_gemm",
}
GIB = 1 << 30


def unpack(bundle: Path, work: Path) -> tuple[Path, bool]:
    """The bundle unpacked under `work` (reused when that exact archive was unpacked before,
    as on a machine kept warm between calls); True when it was reused."""
    target = work / f"bundle-{archive.sha256_of(bundle)[:16]}"
    if (target / COMPLETE).is_file():
        return target, True
    work.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".bundle-", dir=work))
    try:
        archive.extract(bundle, tmp)
        (tmp / COMPLETE).write_text(bundle.name + "\n")
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return target, False


def has_files(folder: Path) -> bool:
    return folder.is_dir() and any(p.is_file() for p in folder.rglob("*"))


def restore_cache(carried: Path, cache: Path) -> str:
    """Fill the compile cache from the carried archive unless it already has files: "kept",
    "restored" or "empty"."""
    if has_files(cache):
        return "kept"
    if carried.is_file():
        archive.extract(carried, cache)
        return "restored"
    cache.mkdir(parents=True, exist_ok=True)
    return "empty"


def pack_cache(cache: Path, dest: Path) -> int | None:
    """The compile cache as an archive at `dest` (its size), or None when there is nothing."""
    if not has_files(cache):
        return None
    return archive.write_archive(cache, dest, preset=6)


def find_library(name: str, roots: Iterable[Path]) -> Path | None:
    """The folder holding `name` (or a versioned file of it) under any root's `nvidia/`, where
    pip's CUDA wheels put their libraries."""
    for root in roots:
        base = root / "nvidia"
        if base.is_dir():
            for path in sorted(base.rglob(f"{name}*")):
                if path.is_file() or path.is_symlink():
                    return path.parent
    return None


def site_roots() -> list[Path]:
    import site  # noqa: PLC0415 - only where the runner runs

    return [Path(p) for p in (*site.getsitepackages(), site.getusersitepackages())]


def find_nvcc(path_variable: str) -> Path | None:
    found = shutil.which("nvcc", path=path_variable)
    if found:
        return Path(found)
    for candidate in sorted(Path("/usr/local").glob("cuda*/bin/nvcc")):
        return candidate
    return None


def runtime_env(
    base: Mapping[str, str],
    *,
    site: Path,
    cache: Path,
    nvrtc_dir: Path | None,
    nvcc: Path | None,
    repo: Path | None = None,
) -> dict[str, str]:
    """The environment of SGLang (`repo` None) or of kvpilot's tools (`repo` on the path too):
    the bundle first on the path, flashinfer off, libnvrtc found, caches in one folder, no
    network."""
    env = dict(base)

    def prepend(variable: str, *first: str) -> None:
        rest = [p for p in env.get(variable, "").split(os.pathsep) if p]
        env[variable] = os.pathsep.join([*first, *(p for p in rest if p not in first)])

    prepend("PYTHONPATH", str(site), *([str(repo)] if repo is not None else []))
    if nvrtc_dir is not None:
        prepend("LD_LIBRARY_PATH", str(nvrtc_dir))
    if nvcc is not None:
        prepend("PATH", str(nvcc.parent))
        env.setdefault("CUDA_HOME", str(nvcc.parent.parent))
    for variable, sub in CACHE_VARIABLES.items():
        env[variable] = str(cache / sub)
    env.update(
        SGLANG_IS_FLASHINFER_AVAILABLE="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    # The machine keeps NVLink multicast off; a process given its own environment keeps it so.
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    env.setdefault("NVSHMEM_DISABLE_NVLS", "1")
    return env


def leftover_servers(work: Path) -> list[int]:
    """Servers kvpilot's process launcher started in an earlier call under `work` that still
    run. The launcher starts SGLang in a session of its own, so that it outlives the bot; a call
    cut off at its time limit therefore leaves the experiment's server holding the GPU."""
    pids: list[int] = []
    for state in sorted(work.glob("calls/*/experiment/state/*.process.json")):
        try:
            pid = int(json.loads(state.read_text())["pid"])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if b"launch_server" in cmdline:
            pids.append(pid)
    return pids


def stop_leftovers(work: Path) -> list[int]:
    """Kill what `leftover_servers` finds (each with its process group); their pids."""
    found = leftover_servers(work)
    for pid in found:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    return found


# ------------------------------------------------------------------------------ early checks


@dataclass(frozen=True)
class Check:
    ok: bool
    what: str  # what was found, or what is wrong
    fix: str = ""  # how to fix it, when it is wrong
    fatal: bool = True  # a failed check that is not fatal is a warning

    def line(self) -> str:
        if self.ok:
            return f"ok: {self.what}"
        word = "error" if self.fatal else "warning"
        return f"{word}: {self.what}" + (f" ({self.fix})" if self.fix else "")


def check_python(version: tuple[int, ...]) -> Check:
    have = ".".join(map(str, version[:3]))
    if tuple(version[:2]) == image.PYTHON:
        return Check(True, f"python {have}")
    return Check(
        False,
        f"python {have}: the bundle holds cp312 wheels",
        "run with the GPU image's python3 (Python 3.12, /opt/torch/.venv/bin/python3)",
    )


def check_torch(version: str | None) -> Check:
    want = image.VERSIONS["torch"]
    if version is None:
        return Check(False, "torch is not installed", f"sglang 0.5.17 needs torch {want}")
    if version.split("+")[0] != want:
        return Check(False, f"torch {version}", f"sglang 0.5.17 needs torch {want} (the image's)")
    return Check(True, f"torch {version}")


def check_bundle(path: Path) -> Check:
    if path.is_file():
        return Check(True, f"bundle {path} ({path.stat().st_size / (1 << 20):.1f} MiB)")
    return Check(
        False,
        f"no bundle at {path}",
        "build it with `make gpu-bundle` where PyPI is reachable and carry `.gpu` to this machine",
    )


def check_library(name: str, folder: Path | None) -> Check:
    if folder is not None:
        return Check(True, f"{name} in {folder}")
    return Check(
        False,
        f"{name} not found under this python's site-packages (nvidia/*/lib)",
        "sgl_kernel's common_ops needs it: use the GPU image's python3, whose CUDA runtime "
        "wheels hold it",
    )


def check_nvcc(nvcc: Path | None, cache_ready: bool) -> Check:
    if nvcc is not None:
        return Check(True, f"nvcc at {nvcc}")
    if cache_ready:
        return Check(
            False,
            "no nvcc on PATH or under /usr/local/cuda*/bin",
            "the carried compile caches hold SGLang's JIT kernels",
            fatal=False,
        )
    return Check(
        False,
        "no nvcc on PATH or under /usr/local/cuda*/bin, and no compile caches",
        "SGLang compiles four JIT kernels at its first start: put nvcc on PATH, or carry "
        ".gpu/jit-cache.tar.xz from an earlier call",
    )


def check_port(port: int, host: str = "127.0.0.1") -> Check:
    """Free if a server could listen on it: with SO_REUSEADDR, as uvicorn binds SGLang's
    (uvicorn/config.py `bind_socket`), so connections a stopped server left in TIME_WAIT do
    not count."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return Check(False, f"port {port} is taken ({exc.strerror})", "pass another --port")
    return Check(True, f"port {port} is free")


def check_disk(folder: Path, need_gib: float = 2.0) -> Check:
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free / GIB
    if free >= need_gib:
        return Check(True, f"{free:.0f} GiB free under {folder}")
    return Check(False, f"only {free:.1f} GiB free under {folder}", f"{need_gib:g} GiB needed")


def check_gpus(states: list[object] | None, error: str | None) -> Check:
    if states:
        names = ", ".join(sorted({str(getattr(s, "name", "?")) for s in states}))
        return Check(True, f"{len(states)} GPU(s): {names}")
    return Check(
        False,
        f"no NVIDIA GPU visible ({error or 'NVML lists none'})",
        "run on the GPU machine: the phases start the real SGLang on CUDA",
    )


def python_version() -> tuple[int, ...]:
    return tuple(sys.version_info[:3])
