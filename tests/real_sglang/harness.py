"""Start and stop the real SGLang server (CPU + simulated GPU) from Python tests.

Importable from the main test venv: it never imports sglang or torch. It starts
``tests/real_sglang/launch.py`` (under the ``reaper.py`` supervisor, in a new session) as a
subprocess, talks HTTP with httpx and, on stop, tears the whole process tree down::

    from tests.real_sglang.harness import RealSGLang, sglang_env_available

    with RealSGLang.start(None, ["--max-total-tokens", "20000"]) as srv:
        httpx.get(f"{srv.url}/server_info").json()["max_total_num_tokens"]  # 20000

``command=`` starts another server command line the same way (the real SGLang on a GPU,
``tests/real_gpu/``): supervised, waited for, and torn down with everything it started.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import httpx
import psutil

from tests.ports import free_port

HERE = Path(__file__).resolve().parent
LAUNCH = HERE / "launch.py"
REAPER = HERE / "reaper.py"
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


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def session_members(sid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes of session ``sid``."""
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (OSError, psutil.Error):
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
        self.proc = proc  # the reaper; it leads the session every server process belongs to
        self.host = host
        self.port = port
        self.args = list(args)
        self.workdir = workdir
        self.log_path = workdir / "server.log"
        self.api_key = api_key
        self.startup_s: float | None = None
        self._final_log = ""
        self._shm_files: set[str] = set()
        self._stopped = False

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
        command: Sequence[str] | None = None,
    ) -> RealSGLang:
        """Launch the server and wait until ``GET /health`` answers 200.

        ``port`` None picks a free port (and picks another if that one is taken by the time the
        server binds it). ``args`` are SGLang server flags (``--port`` and ``--host`` are
        appended from the parameters); ``env`` overrides environment variables (for example
        ``KVPILOT_SIM_GPU_GIB``). ``command`` replaces the CPU launcher (``launch.py`` under the
        SGLang venv's python) by another server command line, for example
        ``[python3, "-m", "sglang.launch_server", ...]``. On failure everything started is torn
        down and :class:`RealSGLangError` carries the tail of the server log.
        """
        attempts = 3 if port is None else 1
        for attempt in range(attempts):
            try:
                return cls._start_once(port, args, env, host=host, timeout=timeout, command=command)
            except RealSGLangError as exc:
                if attempt + 1 == attempts or "address already in use" not in str(exc).lower():
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def _start_once(
        cls,
        port: int | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        *,
        host: str = "127.0.0.1",
        timeout: float = DEFAULT_START_TIMEOUT_S,
        command: Sequence[str] | None = None,
    ) -> RealSGLang:
        if command is None and not sglang_env_available():
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
        # If this process dies without stop(), the reaper removes the work directory itself.
        full_env["KVPILOT_REAPER_CLEANUP_DIR"] = str(workdir)
        argv = [
            sys.executable,
            str(REAPER),
            *(command or (sys.executable, str(LAUNCH))),
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
        """Poll until ``/health`` is 200 and the log shows this server bound ``host:port``."""
        began = time.monotonic()
        deadline = began + timeout
        bound = f"Uvicorn running on http://{self.host}:{self.port}"
        with httpx.Client(timeout=5.0, headers=self.headers) as client:
            while True:
                code = self.proc.poll()
                if code is not None:
                    raise RealSGLangError(
                        f"SGLang exited with code {code} during start-up; log tail:\n"
                        + self.log_tail()
                    )
                log = self.log_text()
                if "error while attempting to bind on address" in log:
                    # Uvicorn could not bind; SGLang then hangs instead of exiting.
                    raise RealSGLangError(
                        f"port {self.port} is taken (address already in use); log tail:\n"
                        + self.log_tail()
                    )
                with contextlib.suppress(httpx.HTTPError):
                    # The log check guards against another process holding the same port.
                    if client.get(f"{self.url}/health").status_code == 200 and bound in log:
                        self.startup_s = time.monotonic() - began
                        self._shm_files |= self._held_shm_files()
                        return
                if time.monotonic() > deadline:
                    raise RealSGLangError(
                        f"SGLang not healthy after {timeout:.0f} s; log tail:\n" + self.log_tail()
                    )
                time.sleep(0.5)

    def stop(self, graceful: bool = False) -> None:
        """Stop the server and every process it started; remove what it left on disk.

        By default the process tree is killed at once (SIGKILL, well under a second).
        ``graceful=True`` sends SIGTERM to SGLang first and lets it drain and shut down (about
        5 s, at most 10 s). Either way this returns only when no process of the server's
        session is left (not even a zombie), then removes the work directory (log, TMPDIR) and
        the server's ``/dev/shm`` segment. Safe to call twice.
        """
        if self._stopped:
            return
        sid = self.proc.pid
        if self.proc.poll() is None:
            self._shm_files |= self._held_shm_files()
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM if graceful else signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(30 if graceful else 15)
        # Fallback when the reaper itself is gone or stuck: kill what is left of the session.
        for proc in session_members(sid):
            with contextlib.suppress(psutil.Error):
                proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        deadline = time.monotonic() + 10
        while session_members(sid) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = session_members(sid)
        if left:
            raise RuntimeError(f"processes left behind: {[p.pid for p in left]}")
        for path in self._shm_files:  # SGLang never unlinks its load-snapshot segment
            with contextlib.suppress(OSError):
                os.unlink(path)
        # Keep the log readable after the work directory is gone.
        if self.log_path.exists():
            self._final_log = self.log_path.read_text(errors="replace")
        shutil.rmtree(self.workdir, ignore_errors=True)
        self._stopped = True

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
        """PIDs of the live processes of the server's session (the reaper included)."""
        return sorted(p.pid for p in session_members(self.proc.pid))

    def server_pids(self) -> list[int]:
        """PIDs of the SGLang processes (HTTP server, scheduler, detokenizer, helpers)."""
        return [pid for pid in self.pids() if pid != self.proc.pid]

    def rss_bytes(self) -> int:
        """Resident memory of the SGLang processes, in bytes."""
        total = 0
        for pid in self.server_pids():
            with contextlib.suppress(psutil.Error):
                total += psutil.Process(pid).memory_info().rss
        return total

    def _held_shm_files(self) -> set[str]:
        """``/dev/shm`` files that the server's processes have open or mapped."""
        held: set[str] = set()
        for proc in session_members(self.proc.pid):
            with contextlib.suppress(psutil.Error):
                held.update(f.path for f in proc.open_files())
                held.update(m.path for m in proc.memory_maps(grouped=True))
        return {p for p in held if p.startswith("/dev/shm/")}
