"""The container image definition, checked without a Docker daemon.

What a build would catch early is checked here: every file the Dockerfile copies exists and is
not left out of the build context by .dockerignore (matched with Docker's rules), the
dependencies come from requirements.lock with hashes, the command it runs is one the CLI
accepts, and the HEALTHCHECK command really tells a healthy bot from an unhealthy one (it is run
against servers on loopback).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bot.cli import build_parser
from tests.deploy.units import DEPLOY, REPO
from tests.ports import free_port

DOCKERFILE = DEPLOY / "docker" / "Dockerfile"


@dataclass(frozen=True)
class Instruction:
    stage: int
    op: str
    args: str


def instructions(path: Path = DOCKERFILE) -> list[Instruction]:
    """The instructions, with line continuations joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    out: list[Instruction] = []
    stage = -1
    for line in logical:
        op, _, args = line.partition(" ")
        if op.upper() == "FROM":
            stage += 1
        out.append(Instruction(stage, op.upper(), args.strip()))
    return out


def exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value)
    return value


class DockerIgnore:
    """Docker's .dockerignore rules: Go-style globs with `**`, `!` exceptions, last match wins,
    and a path is left out when it or any directory above it matches."""

    def __init__(self, text: str) -> None:
        self.rules: list[tuple[bool, re.Pattern[str]]] = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            include = line.startswith("!")
            pattern = line[1:].strip() if include else line
            self.rules.append((include, re.compile(self._regex(pattern.strip("/")))))

    @staticmethod
    def _regex(pattern: str) -> str:
        out, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                out, i = out + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                out, i = out + ".*", i + 2
            elif pattern[i] == "*":
                out, i = out + "[^/]*", i + 1
            elif pattern[i] == "?":
                out, i = out + "[^/]", i + 1
            elif pattern[i] == "[":
                end = pattern.index("]", i)
                out, i = out + pattern[i : end + 1], end + 1
            else:
                out, i = out + re.escape(pattern[i]), i + 1
        return out + r"\Z"

    def excluded(self, path: str) -> bool:
        parts = path.strip("/").split("/")
        candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        result = False
        for include, regex in self.rules:
            if any(regex.match(c) for c in candidates):
                result = not include
        return result


IGNORE = DockerIgnore((REPO / ".dockerignore").read_text())


def test_the_image_starts_from_python_311_slim_and_runs_as_a_user() -> None:
    steps = instructions()
    # one base for both stages, python:3.11-slim unless the build names another (BASE)
    assert steps[0].op == "ARG" and steps[0].args == "BASE=python:3.11-slim", steps[0]
    bases = [s.args.split()[0] for s in steps if s.op == "FROM"]
    assert bases and all(b == "${BASE}" for b in bases)
    # no `# syntax=` line: BuildKit would pull its frontend image from a registry
    assert not DOCKERFILE.read_text().lstrip().lower().startswith("# syntax")
    final = max(s.stage for s in steps)
    users = [s.args for s in steps if s.op == "USER" and s.stage == final]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert "sglang" not in (REPO / "requirements.lock").read_text().lower()


def test_every_copied_file_exists_and_reaches_the_build_context() -> None:
    sources: list[str] = []
    for step in instructions():
        if step.op in ("COPY", "ADD") and "--from=" not in step.args:
            *srcs, _dest = step.args.split()
            sources += srcs
    assert "requirements.lock" in sources and "pyproject.toml" in sources
    for source in sources:
        path = REPO / source
        assert path.exists(), f"COPY {source}: no such file in the repository"
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        shipped = [f for f in files if "__pycache__" not in f.parts and not f.name.endswith(".pyc")]
        left_out = [
            str(f.relative_to(REPO)) for f in shipped if IGNORE.excluded(str(f.relative_to(REPO)))
        ]
        assert not left_out, f"COPY {source}: .dockerignore leaves out {left_out[:5]}"
    # pyproject.toml names README.md as the long description: the build needs it.
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert meta["project"]["readme"] in sources


def test_dockerignore_leaves_out_environments_state_and_caches() -> None:
    for path in (
        ".venv/bin/python",
        ".venv-sglang/lib/python3.11/site-packages/torch/__init__.py",
        "demo/run/kvpilot.db",
        "var/kvpilot.db",
        "var/state/incident.process.json",
        ".mypy_cache/3.11/bot/cli.data.json",
        ".pytest_cache/v/cache/nodeids",
        "bot/__pycache__/cli.cpython-311.pyc",
        "tests/fixtures/sglang/0.5.23/server_info.json",
        ".git/HEAD",
        "kvpilot.egg-info/PKG-INFO",
    ):
        assert IGNORE.excluded(path), path
    assert not IGNORE.excluded("bot/chat/templates/chat/help.md.j2")
    assert not IGNORE.excluded("requirements.lock")


def test_dependencies_come_from_the_lock_with_hashes_and_the_project_without() -> None:
    runs = [s.args for s in instructions() if s.op == "RUN"]
    installs = [r for r in runs if "pip install" in r]
    locked = [r for r in installs if "requirements.lock" in r]
    assert len(locked) == 1 and "--require-hashes" in locked[0] and " -r " in locked[0]
    project = [r for r in installs if r not in locked]
    assert len(project) == 1
    # the project as `make dist` builds it: a wheel with the locked setuptools, then installed
    # without resolving anything again
    assert "pip wheel --no-deps --no-build-isolation -w /src/dist ." in project[0]
    assert "pip install --no-deps /src/dist/kvpilot-*.whl" in project[0]
    # Nothing else is installed by name (no unpinned package, no SGLang).
    for command in installs:
        for part in command.split("&&"):
            if "pip install" in part:
                words = part.split("pip install", 1)[1].split()
                named = [w for w in words if not w.startswith("-") and w not in (".",)]
                assert named in ([], ["/src/image.lock"], ["/src/dist/kvpilot-*.whl"]), part
    # ... the image's lock being the lock less the tests' schema validator
    assert "/src/requirements.lock > /src/image.lock" in locked[0]
    # The message templates travel as package data, and the build checks they arrived.
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "templates/**/*.j2" in data["package-data"]["bot.chat"]
    assert any("templates missing" in r for r in runs)


def test_entrypoint_and_command_are_a_serve_the_cli_accepts() -> None:
    steps = instructions()
    entry = exec_form(next(s.args for s in steps if s.op == "ENTRYPOINT"))
    cmd = exec_form(next(s.args for s in steps if s.op == "CMD"))
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert entry == ["kvpilot"] and "kvpilot" in scripts
    ns = build_parser().parse_args(cmd)
    assert (ns.command, ns.config, ns.port) == ("serve", "/etc/kvpilot/kvpilot.toml", 3000)
    assert any(s.op == "EXPOSE" and s.args.split() == ["3000"] for s in steps)
    volumes = [exec_form(s.args) for s in steps if s.op == "VOLUME"]
    assert ["/var/lib/kvpilot"] in volumes


def healthcheck_command() -> list[str]:
    step = next(s for s in instructions() if s.op == "HEALTHCHECK")
    options, _, command = step.args.partition("CMD ")
    assert "--timeout=" in options and "--interval=" in options
    argv = exec_form(command)
    assert argv[0] == "python"  # the slim image has no curl
    return argv


@contextmanager
def health_server(status: int) -> Iterator[int]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code = status if self.path == "/healthz" else 404
            body = json.dumps({"ok": code == 200}).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def image_env() -> dict[str, str]:
    """The final stage's ENV settings (`ENV A=1 B=2`)."""
    steps = instructions()
    final = max(s.stage for s in steps)
    found: dict[str, str] = {}
    for step in steps:
        if step.op == "ENV" and step.stage == final:
            for word in step.args.split():
                key, _, value = word.partition("=")
                found[key] = value
    return found


def run_healthcheck(port: int) -> int:
    argv = healthcheck_command()
    url = image_env()["KVPILOT_HEALTH_URL"]
    assert url == "http://127.0.0.1:3000/healthz"  # the CMD's port
    env = {**os.environ, "KVPILOT_HEALTH_URL": url.replace(":3000/", f":{port}/")}
    done = subprocess.run(
        [sys.executable, *argv[1:]], capture_output=True, timeout=30, check=False, env=env
    )
    return done.returncode


@pytest.mark.parametrize(("status", "healthy"), [(200, True), (503, False), (500, False)])
def test_the_healthcheck_tells_a_healthy_bot_from_a_failing_one(status: int, healthy: bool) -> None:
    with health_server(status) as port:
        assert (run_healthcheck(port) == 0) is healthy


def test_the_healthcheck_fails_when_nothing_listens() -> None:
    assert run_healthcheck(free_port()) != 0
