"""`make gpu-bundle`: everything the real SGLang needs on the GPU machine beyond its image, as one
archive of at most 56 MiB in `.gpu/` (carried to the machine with `carry=[".gpu"]`).

    .venv/bin/python -m tests.real_gpu.bundle [--budget-mib 56] [--preset 6]
    .venv/bin/python -m tests.real_gpu.bundle --relock   # after editing a pin

Steps: download the pinned cp312 manylinux wheels (`requirements-gpu.txt`, hashes checked by pip
and again here; wheels already downloaded with the right hash are reused, so a rebuild works
offline), check that what they declare is carried, in the GPU image or known to be unneeded,
unpack them into `.gpu-build/stage/site` without what STRIP_RULES drops, add the stand-ins,
make the model directory (`tests/real_sglang/make_model.py --recipe gpu`, with the bundle's own
tokenizers), check that the pure-Python parts import, and pack `site/`, `model/` and
`BUNDLE.json` into `.gpu/kvpilot-gpu-bundle.tar.xz`. The same lock gives the same archive.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from tests.real_gpu import archive, image, stage
from tests.real_gpu.archive import sha256_of
from tests.real_gpu.lock import (
    LockError,
    Pin,
    declared_requirements,
    match_wheels,
    parse_lock,
    render_lock,
    unmet,
    wheel_key,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
LOCK = HERE / "requirements-gpu.txt"
ARCHIVE = REPO / ".gpu" / "kvpilot-gpu-bundle.tar.xz"
WORK = REPO / ".gpu-build"
MAKE_MODEL = REPO / "tests" / "real_sglang" / "make_model.py"
BUDGET_MIB = 56.0
# The image's glibc is 2.39 (Ubuntu 24.04): any manylinux tag up to it loads there.
PLATFORMS = ["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64"] + [
    f"manylinux_2_{n}_x86_64" for n in range(5, 40)
]
# Pure-Python modules of the bundle that this machine's Python can import too: a check that the
# unpacked wheels are whole, and that the stand-ins load.
IMPORT_CHECK = (
    "uvicorn",
    "starlette",
    "slack_sdk",
    "slack_bolt",
    "sqlite_utils",
    "tenacity",
    "apscheduler",
    "flashinfer.sampling",
    "flashinfer.prefill",
    "soundfile",
    "zstandard",
    "IPython.display",
)
LOCK_HEADER = """\
The GPU bundle's packages (tests/real_gpu/bundle.py): cp312 manylinux x86_64 wheels, each with
the hash of the one file pip downloads for the GPU image. sglang 0.5.17 (the last releases before
0.5.19 pin torch==2.11.0, the image's) and what it needs beyond the image, then kvpilot's own
dependencies the image lacks (the Kubernetes client is left out: only its launcher imports it).
Versions follow sglang's pins (transformers, tokenizers, xgrammar, openai, compressed-tensors,
apache-tvm-ffi) and otherwise requirements.lock and tests/real_sglang/requirements.txt.
Edit a pin, then `python -m tests.real_gpu.bundle --relock` writes the hashes again."""


def say(message: str) -> None:
    print(f"[gpu-bundle {time.strftime('%H:%M:%S')}] {message}", flush=True)


def pip_download(requirements: Path, dest: Path, *, hashes: bool) -> None:
    argv = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        *(arg for p in PLATFORMS for arg in ("--platform", p)),
        "-r",
        str(requirements),
        "-d",
        str(dest),
        "--quiet",
    ]
    if hashes:
        argv.insert(4, "--require-hashes")
    dest.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(argv, check=False)
    if result.returncode != 0:
        raise SystemExit(
            f"error: pip download failed (exit {result.returncode}): PyPI must be reachable "
            "for the first build; later builds reuse the wheels in .gpu-build/wheels"
        )


def wheel_hashes(folder: Path) -> dict[str, str]:
    return {p.name: sha256_of(p) for p in sorted(folder.glob("*.whl"))}


def fetch(pins: list[Pin], wheels: Path) -> dict[str, str]:
    """Each pin's wheel in `wheels` (canonical name -> file name), downloading what is missing;
    wheels of other pins (an older lock) are removed first."""
    wheels.mkdir(parents=True, exist_ok=True)
    wanted = {(p.name, p.version) for p in pins}
    for path in wheels.glob("*.whl"):
        if wheel_key(path.name) not in wanted:
            say(f"removing {path.name} (not in the lock)")
            path.unlink()
    try:
        return match_wheels(pins, wheel_hashes(wheels))
    except LockError:
        say(f"downloading {len(pins)} wheels from PyPI into {wheels.relative_to(REPO)}")
        pip_download(LOCK, wheels, hashes=True)
    return match_wheels(pins, wheel_hashes(wheels))


def metadata_of(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return zf.read(name).decode()


def check_declared(pins: list[Pin], chosen: dict[str, str], wheels: Path) -> None:
    declared = {
        name: declared_requirements(metadata_of(wheels / file)) for name, file in chosen.items()
    }
    problems = unmet(declared, {p.name: p.version for p in pins}, image.PACKAGES, image.NOT_NEEDED)
    if problems:
        raise SystemExit(
            "error: the lock leaves declared dependencies unmet; pin each in "
            f"{LOCK.relative_to(REPO)} or list it in tests/real_gpu/image.py NOT_NEEDED with "
            "the reason:\n  " + "\n  ".join(problems)
        )


def make_model(tokenizers_wheel: Path, dest: Path) -> str:
    """Build the GPU model directory with the bundle's own tokenizers (an abi3 wheel, so this
    machine's Python loads it too); its recipe version."""
    with tempfile.TemporaryDirectory(prefix="kvpilot-tokenizers-") as tmp:
        with zipfile.ZipFile(tokenizers_wheel) as zf:
            zf.extractall(tmp)
        env = {**os.environ, "PYTHONPATH": tmp}
        subprocess.run(
            [sys.executable, str(MAKE_MODEL), "--recipe", "gpu", str(dest)],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )
    return (dest / ".kvpilot-model-version").read_text().strip()


def check_imports(site: Path) -> None:
    """Import the pure-Python parts from `site` in a fresh interpreter; each must come from
    there, not from this environment."""
    code = (
        "import importlib, sys\n"
        "for name in sys.argv[2:]:\n"
        "    m = importlib.import_module(name)\n"
        "    assert m.__file__.startswith(sys.argv[1]), (name, m.__file__)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run(
        [sys.executable, "-c", code, str(site), *IMPORT_CHECK],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"error: the staged packages do not import:\n{result.stderr[-3000:]}")


def build(ns: argparse.Namespace) -> int:
    started = time.monotonic()
    pins = parse_lock(LOCK.read_text())
    wheels, stage_dir = WORK / "wheels", WORK / "stage"
    chosen = fetch(pins, wheels)
    check_declared(pins, chosen, wheels)
    say(f"{len(chosen)} wheels match the lock; unpacking into {stage_dir.relative_to(REPO)}")
    shutil.rmtree(stage_dir, ignore_errors=True)
    site = stage_dir / "site"
    site.mkdir(parents=True)
    tally = stage.Unpacked()
    for name in sorted(chosen):
        stage.unpack_wheel(wheels / chosen[name], site, tally)
    stand_ins = stage.write_stand_ins(site, image.STAND_INS)
    recipe = make_model(wheels / chosen["tokenizers"], stage_dir / "model")
    check_imports(site)
    manifest = {
        "format": 1,
        "python": ".".join(map(str, image.PYTHON)),
        "lock_sha256": sha256_of(LOCK),
        "packages": {p.name: p.version for p in pins},
        "stand_ins": stand_ins,
        "stripped": {"files": tally.stripped, "bytes": tally.stripped_bytes},
        "model_recipe": recipe,
    }
    (stage_dir / "BUNDLE.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    unpacked = tally.kept_bytes
    say(
        f"kept {tally.kept} files ({unpacked / archive.MIB:.0f} MiB), stripped "
        f"{tally.stripped} ({tally.stripped_bytes / archive.MIB:.0f} MiB); compressing "
        f"(xz preset {ns.preset})"
    )
    size = archive.write_archive(
        stage_dir,
        ns.out,
        preset=ns.preset,
        on_progress=lambda i, n: say(f"  {i}/{n} entries"),
    )
    biggest = stage.largest(stage.sizes_by_top_level(site))
    problem = archive.size_problem(size, int(ns.budget_mib * archive.MIB), biggest)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    say(
        f"wrote {ns.out} ({size / archive.MIB:.1f} MiB of {ns.budget_mib:g}; "
        f"sha256 {sha256_of(ns.out)[:16]}) in {time.monotonic() - started:.0f} s; largest "
        "parts unpacked: "
        + ", ".join(f"{name} {n / archive.MIB:.0f} MiB" for name, n in biggest[:6])
    )
    if not ns.keep_stage:
        shutil.rmtree(stage_dir)
    return 0


def relock() -> int:
    """Download the lock's name==version pins without hashes and write the hashes found."""
    pins = parse_lock(LOCK.read_text())
    with tempfile.TemporaryDirectory(prefix="kvpilot-relock-") as tmp:
        plain = Path(tmp) / "pins.txt"
        plain.write_text("".join(f"{p.line}\n" for p in pins))
        pip_download(plain, Path(tmp) / "wheels", hashes=False)
        found = {wheel_key(f): h for f, h in wheel_hashes(Path(tmp) / "wheels").items()}
    missing = [p.line for p in pins if (p.name, p.version) not in found]
    if missing:
        print(f"error: no wheel downloaded for {', '.join(missing)}", file=sys.stderr)
        return 1
    fresh = [Pin(p.name, p.version, (found[(p.name, p.version)],)) for p in pins]
    LOCK.write_text(render_lock(LOCK_HEADER, fresh))
    say(f"wrote {LOCK.relative_to(REPO)} ({len(fresh)} pins)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.real_gpu.bundle", description=__doc__)
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--out", type=Path, default=ARCHIVE, help="the archive (default: %(default)s)")
    p.add_argument("--budget-mib", type=float, default=BUDGET_MIB, help="largest size allowed")
    p.add_argument("--preset", type=int, choices=range(10), default=6, help="xz preset")
    p.add_argument("--keep-stage", action="store_true", help="keep .gpu-build/stage afterwards")
    p.add_argument("--relock", action="store_true", help="rewrite the lock's hashes and stop")
    ns = p.parse_args(argv)
    try:
        return relock() if ns.relock else build(ns)
    except LockError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
