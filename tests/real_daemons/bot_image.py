"""Build kvpilot's own image from deploy/docker/Dockerfile on the real Docker Engine, as an
operator would, and save it where `make test-daemons` loads it (tests/real_daemons/
test_bot_image.py): `make bot-image`, or `python -m tests.real_daemons.bot_image`.

No registry can be reached here, so the Dockerfile's base (python:3.11-slim: Debian 12 with
Python 3.11) is stood in for by Debian 12 itself, made with debootstrap from Debian's mirror
(python3, its venv module, `python`, ssh and CA certificates) and imported. The build reaches
PyPI for the locked packages, with the host's network (dockerd runs without a bridge). That is
why it is a setup step beside the environments, not a test: the tests that run the image stay
offline.

Idempotent: the base is made once; the image is built again when a file that goes into it
changes (the build context's hash is stored beside the saved image).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.real_daemons.dockerd import Dockerd, running_dockerd
from tests.twin_process import REPO

OUT = REPO / ".venv" / "kvpilot-images"
BASE_TAR = OUT / "base-bookworm.tar"
IMAGE_TAR = OUT / "kvpilot-bot.tar"
STAMP = OUT / "kvpilot-bot.sha256"
BASE = "kvpilot/base-bookworm:12"
IMAGE = "kvpilot/bot:test"
PACKAGES = "python3,python3-venv,python-is-python3,openssh-client,ca-certificates"
MIRROR = "http://deb.debian.org/debian"
# What the Dockerfile copies (and so what decides whether the image must be built again).
CONTEXT = ["deploy/docker/Dockerfile", "requirements.lock", "pyproject.toml", "README.md"]
SOURCES = ["bot", "playbooks", "storage", "deploy/slack", "deploy/systemd"]


def context_hash() -> str:
    digest = hashlib.sha256()
    files = [REPO / f for f in CONTEXT]
    for top in SOURCES:
        files += [
            p for p in (REPO / top).rglob("*") if p.is_file() and "__pycache__" not in p.parts
        ]
    for path in sorted(files):
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def docker(d: Dockerd, *argv: str, **kw: object) -> None:
    binary = shutil.which("docker")
    assert binary is not None, "the docker client is needed (Debian's docker.io has it)"
    # the classic builder: BuildKit (the client's default) would want a buildx plugin
    env = {**os.environ, "DOCKER_HOST": f"unix://{d.socket}", "DOCKER_BUILDKIT": "0"}
    subprocess.run([binary, *argv], check=True, env=env, **kw)  # type: ignore[call-overload]


def make_base() -> None:
    """Debian 12 with Python 3.11, as a tar of its root file system."""
    if BASE_TAR.exists():
        return
    if shutil.which("debootstrap") is None:
        sys.exit("debootstrap is needed: apt-get install -y --no-install-recommends debootstrap")
    root = Path(tempfile.mkdtemp(prefix="kvbase-"))
    try:
        subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={PACKAGES}", "bookworm",
             str(root / "fs"), MIRROR],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
        for entry in (root / "fs/var/cache/apt/archives").glob("*.deb"):
            entry.unlink()
        trust_this_network(root / "fs")
        partial = BASE_TAR.with_suffix(".partial")
        subprocess.run(["tar", "-C", str(root / "fs"), "-cf", str(partial), "."], check=True)
        partial.rename(BASE_TAR)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def trust_this_network(fs: Path) -> None:
    """The certificate authorities this host adds to Debian's (an egress proxy's, a company's)
    go into the base too, and pip is told to use the system's bundle rather than its own, as
    an organisation's internal base image does; without them the build cannot reach PyPI."""
    extra = sorted(Path("/usr/local/share/ca-certificates").glob("*.crt"))
    if not extra:
        return
    target = fs / "usr/local/share/ca-certificates"
    target.mkdir(parents=True, exist_ok=True)
    for cert in extra:
        shutil.copy(cert, target / cert.name)
    subprocess.run(["chroot", str(fs), "update-ca-certificates"], check=True, capture_output=True)
    (fs / "etc/pip.conf").write_text("[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n")


def build(d: Dockerd) -> None:
    with BASE_TAR.open("rb") as tar:
        docker(d, "import", "-", BASE, stdin=tar, stdout=subprocess.DEVNULL)
    docker(
        d, "build", "--network", "host", "--build-arg", f"BASE={BASE}", "-f",
        "deploy/docker/Dockerfile", "-t", IMAGE, ".", cwd=REPO,
    )  # fmt: skip
    partial = IMAGE_TAR.with_suffix(".partial")
    docker(d, "save", "-o", str(partial), IMAGE)
    partial.rename(IMAGE_TAR)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; a second waits for the first
        wanted = context_hash()
        if IMAGE_TAR.exists() and STAMP.exists() and STAMP.read_text() == wanted:
            print(f"{IMAGE_TAR} is up to date")
            return 0
        start = time.monotonic()
        make_base()
        based = time.monotonic()
        with running_dockerd() as d:
            build(d)
        STAMP.write_text(wanted)
        print(
            f"base {based - start:.0f} s, image {time.monotonic() - based:.0f} s: {IMAGE_TAR} "
            f"({IMAGE_TAR.stat().st_size / 1e6:.0f} MB)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
