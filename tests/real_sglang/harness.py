"""Start and stop the real SGLang server (CPU + simulated GPU) from Python tests.

Importable from the main test venv: it never imports sglang or torch. It starts
``tests/real_sglang/launch.py`` as a subprocess in a new session, talks HTTP with httpx and, on
stop, kills the whole process group::

    from tests.real_sglang.harness import RealSGLang, free_port, sglang_env_available

    with RealSGLang.start(free_port(), ["--max-total-tokens", "20000"]) as srv:
        httpx.get(f"{srv.url}/server_info").json()["max_total_num_tokens"]  # 20000
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import httpx
import psutil

HERE = Path(__file__).resolve().parent
LAUNCH = HERE / "launch.py"
REPO = HERE.parents[1]
STAMP_NAME = ".kvpilot-sglang-installed"

DEFAULT_START_TIMEOUT_S = 120.0
LOG_TAIL_CHARS = 6000


class RealSGLangError(RuntimeError):
    """The server did not come up (the message ends with the tail of its log)."""


def sglang_venv() -> Path:
    return Path(os.environ.get("KVPILOT_SGLANG_VENV") or REPO / ".venv-sglang")


def sglang_env_available() -> bool:
    """True when ``setup.sh`` has completed (the venv's python and its stamp file exist)."""
    venv = sglang_venv()
    return (venv / "bin" / "python").exists() and (venv / STAMP_NAME).is_file()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0 and read it back)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _group_members(pgid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of process group ``pgid``."""
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


class RealSGLang:
    """One running server. Use :meth:`start`; stop it with :meth:`stop` or a ``with`` block."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        *,
        host: str,
        port: int,
        args: Sequence[str],
        workdir: Path,
        api_key: str | None,
    ) -> None:
        self.proc = proc
        self.host = host
        self.port = port
        self.args = list(args)
        self.workdir = workdir
        self.log_path = workdir / "server.log"
        self.api_key = api_key
        self.startup_s: float | None = None
        self._final_log = ""

    # ---- lifecycle ---------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        port: int | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        *,
        host: str = "127.0.0.1",
        timeout: float = DEFAULT_START_TIMEOUT_S,
    ) -> RealSGLang:
        """Launch the server and wait until ``GET /health`` answers 200.

        ``args`` are SGLang server flags (``--port``/``--host`` are added from the parameters);
        ``env`` overrides environment variables (for example ``KVPILOT_SIM_GPU_GIB``). On
        failure the process group is killed and :class:`RealSGLangError` carries the log tail.
        """
        if not sglang_env_available():
            raise RealSGLangError(
                f"SGLang environment not installed at {sglang_venv()}; "
                "run tests/real_sglang/setup.sh"
            )
        port = free_port(host) if port is None else port
        workdir = Path(tempfile.mkdtemp(prefix=f"kvpilot-sglang-{port}-"))
        tmpdir = workdir / "tmp"
        tmpdir.mkdir()
        full_env = dict(os.environ)
        full_env.update(env or {})
        # SGLang's temporary files (Prometheus multiprocess dir, ...) go under the workdir,
        # which stop() removes.
        full_env["TMPDIR"] = str(tmpdir)
        argv = [
            sys.executable,
            str(LAUNCH),
            *args,
            "--host",
            host,
            "--port",
            str(port),
        ]
        log = open(workdir / "server.log", "wb")  # noqa: SIM115
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full_env,
                cwd=str(REPO),
                start_new_session=True,
            )
        finally:
            log.close()
        server = cls(
            proc,
            host=host,
            port=port,
            args=args,
            workdir=workdir,
            api_key=_flag_value(args, "--api-key"),
        )
        try:
            server.wait_healthy(timeout)
        except BaseException:
            server.stop()
            raise
        return server

    def wait_healthy(self, timeout: float) -> None:
        began = time.monotonic()
        deadline = began + timeout
        with httpx.Client(timeout=5.0, headers=self.headers) as client:
            while True:
                code = self.proc.poll()
                if code is not None:
                    raise RealSGLangError(
                        f"SGLang exited with code {code} during start-up; log tail:\n"
                        + self.log_tail()
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.url}/health").status_code == 200:
                        self.startup_s = time.monotonic() - began
                        return
                if time.monotonic() > deadline:
                    raise RealSGLangError(
                        f"SGLang not healthy after {timeout:.0f} s; log tail:\n" + self.log_tail()
                    )
                time.sleep(0.5)

    def stop(self, grace: float = 10.0) -> None:
        """Stop the server and every process it started; remove its work directory.

        SIGTERM goes to the server process first (SGLang then shuts its children down); after
        ``grace`` seconds, or as soon as the server is gone, the whole process group gets
        SIGKILL, and this waits until no member of the group is left.
        """
        pgid = self.proc.pid  # start_new_session: the server leads its own group
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        deadline = time.monotonic() + 10
        while _group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _group_members(pgid)
        if left:
            raise RuntimeError(f"processes left behind: {[p.pid for p in left]}")
        # Keep the log readable after the work directory is gone.
        if self.log_path.exists():
            self._final_log = self.log_path.read_text(errors="replace")
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> RealSGLang:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ---- access ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, timeout: float = 60.0) -> httpx.Client:
        """An httpx client with the base URL and (when ``--api-key`` was given) the auth header."""
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    def log_text(self) -> str:
        if self.log_path.exists():
            return self.log_path.read_text(errors="replace")
        return self._final_log

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        return self.log_text()[-chars:]

    def pids(self) -> list[int]:
        """PIDs of the live processes of the server's process group."""
        return sorted(p.pid for p in _group_members(self.proc.pid))

    def rss_bytes(self) -> int:
        """Resident memory of the whole process group, in bytes."""
        total = 0
        for proc in _group_members(self.proc.pid):
            with contextlib.suppress(psutil.Error):
                total += proc.memory_info().rss
        return total
