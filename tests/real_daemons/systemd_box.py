"""systemd as PID 1 of a container of the real Docker Engine, reached over SSH as production
reaches a GPU host: Debian's systemd 252 and OpenSSH from the host, mounted read-only.

What our machines allow: no --privileged, so SYS_ADMIN, no seccomp filter, tmpfs on /run and
/run/lock, and the cgroup hierarchy mounted read-write. The box's /etc is a copy of the host's,
writable (users and configuration can be added, as on a host being set up), with an empty
/etc/systemd/system where the tests' units and kvpilot's drop-ins go; root's ~/.ssh is a
directory of the test. sshd listens on a free port of the host's network, set with a drop-in of
ssh.service (Debian's /etc/default/ssh would override SSHD_OPTS). The checkout is mounted at
its own path and, for services with a private /tmp (where a checkout may live), at SOURCE.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.ports import free_port
from tests.real_daemons.docker_harness import mounts
from tests.real_daemons.dockerd import BASE_IMAGE, Dockerd, unavailable
from tests.twin_process import REPO

SYSTEMD = "/lib/systemd/systemd"
SOURCE = "/opt/kvpilot-src"  # the checkout again, outside /tmp


@dataclass
class SystemdBox:
    daemon: Dockerd
    name: str
    units: Path  # the box's /etc/systemd/system, on this host
    key: Path  # the private key root's authorized_keys accepts
    port: int  # sshd's port on 127.0.0.1

    @property
    def ssh_host(self) -> str:
        return "root@127.0.0.1"

    @property
    def ssh_options(self) -> list[str]:
        return [
            "-p", str(self.port), "-i", str(self.key), "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
        ]  # fmt: skip

    def ssh(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """`argv` run on the box, quoted for the remote shell as the systemd launcher does."""
        remote = shlex.join(argv)
        command = ["ssh", "-o", "BatchMode=yes", *self.ssh_options, self.ssh_host, remote]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)

    def exec(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return docker(self.daemon, "exec", self.name, *argv, timeout=timeout)

    def host_pid(self, pid: int) -> int | None:
        """The host's pid of the box's process `pid` (systemd's MainPID is the box's own)."""
        inspected = docker(self.daemon, "inspect", "-f", "{{.State.Pid}}", self.name)
        init = int(inspected.stdout.strip())
        namespace = os.readlink(f"/proc/{init}/ns/pid")
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.readlink(entry / "ns" / "pid") != namespace:
                    continue
                status = (entry / "status").read_text()
            except OSError:
                continue
            found = re.search(r"^NSpid:\s+(.*)$", status, re.MULTILINE)
            if found and found.group(1).split()[-1] == str(pid):
                return int(entry.name)
        return None


def docker(daemon: Dockerd, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("docker")
    assert binary is not None, "the docker client is needed (Debian's docker.io has it)"
    env = {**os.environ, "DOCKER_HOST": f"unix://{daemon.socket}"}
    return subprocess.run([binary, *argv], capture_output=True, text=True, timeout=timeout, env=env)


@contextmanager
def running_systemd_box(daemon: Dockerd) -> Iterator[SystemdBox]:
    for tool in ("ssh", "ssh-keygen", "sshd"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            unavailable(f"{tool} is not installed (apt-get install openssh-server openssh-client)")
    if not Path(SYSTEMD).exists():
        unavailable(f"{SYSTEMD} is not installed (Debian's systemd package)")
    work = Path(tempfile.mkdtemp(prefix="kvbox-"))
    etc, ssh_dir = work / "etc", work / "ssh"
    shutil.copytree("/etc", etc, symlinks=True, ignore_dangling_symlinks=True)
    units = etc / "systemd" / "system"
    shutil.rmtree(units, ignore_errors=True)  # the host's enabled units do not start in the box
    units.mkdir(parents=True)
    ssh_dir.mkdir(mode=0o700)
    key = work / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    shutil.copy(f"{key}.pub", ssh_dir / "authorized_keys")
    (ssh_dir / "authorized_keys").chmod(0o600)
    port = free_port()
    dropin = units / "ssh.service.d"
    dropin.mkdir()
    (dropin / "port.conf").write_text(
        f"[Service]\nExecStart=\nExecStart=/usr/sbin/sshd -D -p {port} -o ListenAddress=127.0.0.1\n"
    )
    name = f"kvpilot-systemd-{port}"
    binds = [
        *(m for m in mounts() if not m.startswith("/etc:")), "/sys/fs/cgroup:/sys/fs/cgroup:rw",
        f"{etc}:/etc:rw", f"{ssh_dir}:/root/.ssh:rw", f"{REPO}:{SOURCE}:ro",
    ]  # fmt: skip
    argv = [
        "run", "-d", "--name", name, "--network", "host", "--cap-add", "SYS_ADMIN",
        "--security-opt", "seccomp=unconfined", "--tmpfs", "/run", "--tmpfs", "/run/lock",
        "--tmpfs", "/tmp", "--tmpfs", "/var", "-e", "container=docker",
        *(f"--volume={b}" for b in binds), BASE_IMAGE, SYSTEMD, "--system",
    ]  # fmt: skip
    started = docker(daemon, *argv)
    if started.returncode != 0:
        shutil.rmtree(work, ignore_errors=True)
        unavailable(f"systemd could not start in a container: {started.stderr.strip()}")
    box = SystemdBox(daemon, name, units, key, port)
    try:
        deadline = time.monotonic() + 90
        while True:
            state = box.exec("systemctl", "is-system-running").stdout.strip()
            if state in ("running", "degraded"):
                break
            if time.monotonic() > deadline:
                logs = docker(daemon, "logs", "--tail", "50", name)
                said = logs.stdout + logs.stderr
                unavailable(f"systemd in the box is {state!r} after 90 s:\n{said}")
            time.sleep(0.5)
        sshd = box.exec("systemctl", "start", "ssh.service")
        if sshd.returncode != 0:
            journal = box.exec("journalctl", "-u", "ssh", "-n", "30")
            raise AssertionError(sshd.stderr + journal.stdout)
        deadline = time.monotonic() + 30
        while box.ssh("true").returncode != 0:
            assert time.monotonic() < deadline, box.ssh("true").stderr
            time.sleep(0.2)
        yield box
    finally:
        docker(daemon, "rm", "-f", "-v", name)
        shutil.rmtree(work, ignore_errors=True)
