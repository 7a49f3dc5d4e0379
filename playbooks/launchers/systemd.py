"""The `systemd` launcher: the server runs as a service unit on a GPU host, here or over SSH.

kvpilot writes the SGLang command line into a drop-in of the operator's unit
(`/etc/systemd/system/UNIT.d/90-kvpilot.conf`, or the user manager's directory), never into the
unit file, then runs `systemctl daemon-reload` and `systemctl restart UNIT`. The live arguments are
read back from the system (`systemctl cat`: the unit plus its drop-ins, as systemd applies them).
Readiness is the engine's readiness path; failure is the unit's own state (`failed`, an automatic
restart pending, a new invocation, a higher `NRestarts`), explained from that invocation's
journal with the engine's log lines. A failed start is stopped so that `Restart=` does not keep a
broken configuration flapping on the GPUs. Returning to the unit's own command removes the
drop-in, so a revert leaves the host as the operator configured it.

Every command is an argument vector. Over SSH the vector is quoted with `shlex.join` for the
remote shell; files are written by a fixed `sh -c` script that receives paths as arguments.

Why it is long: systemd's launcher works the same here and over SSH, for system and user
managers, with its drop-in, its daemon-reload and its journal reading, which share one set of
command runners.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import PurePosixPath

from playbooks.clock import Clock, WallClock
from playbooks.engines import default_engine
from playbooks.engines.base import Engine
from playbooks.engines.exits import ExitCause, Failure
from playbooks.launchers.base import Finding, LaunchError, ServerIdentity, ServerState
from playbooks.launchers.common import (
    StartThenWait,
    health_ok,
    poll_until,
    split_command,
    still_starting,
    tail,
)
from playbooks.launchers.systemd_exit import systemd_failure
from playbooks.launchers.systemd_unit import (
    ExecCommand,
    UnitFile,
    UnitSyntaxError,
    effective_exec_start,
    render_dropin,
    split_cat_output,
)

DROPIN_NAME = "90-kvpilot.conf"
SYSTEM_DROPIN_ROOT = "/etc/systemd/system"
USER_DROPIN_ROOT = ".config/systemd/user"  # under the service user's home directory
STATE_PROPERTIES = (
    "LoadState",
    "ActiveState",
    "SubState",
    "Result",
    "MainPID",
    "ExecMainCode",
    "ExecMainStatus",
    "NRestarts",
    "InvocationID",
    # When the main process was spawned: local time as `format_timestamp` prints it
    # ("Tue 2024-05-14 10:21:03 UTC"), and CLOCK_MONOTONIC in microseconds (0: never).
    "ExecMainStartTimestamp",
    "ExecMainStartTimestampMonotonic",
)
# ExecMainCode is the kernel's si_code for the main process: exited, killed, dumped core.
CLD_EXITED, CLD_KILLED, CLD_DUMPED = 1, 2, 3
_WRITE_SCRIPT = 'mkdir -p -- "$1" && cat > "$2" && mv -f -- "$2" "$3"'
# What `permissions` asks of the host, read-only: whether the drop-in's directory (or the
# nearest one that exists) is writable, the user, and polkit's answer for the two actions a
# restart needs (systemd's src/core/dbus-unit.c and dbus-manager.c check manage-units, with
# the unit and verb as details, and reload-daemon). pkcheck(1): 0 authorised, 1 not, 2 only
# after authentication; 127 from the shell: polkit is not installed.
_CHECK_SCRIPT = """
d=$1; while [ ! -e "$d" ]; do d=$(dirname -- "$d"); done
if [ -d "$d" ] && [ -w "$d" ]; then echo "writable $d"; else echo "read-only $d"; fi
id -u
for action in manage-units reload-daemon; do
  pkcheck --action-id "org.freedesktop.systemd1.$action" --process $$ \
    --detail unit "$2" --detail verb restart >/dev/null 2>&1
  echo $?
done
"""
POLKIT_FIX = (
    "install deploy/systemd/50-kvpilot.rules for kvpilot's user (polkit), or set sudo = true "
    'with a sudoers rule, or run the server as a user unit (scope = "user"): docs/launchers.md'
)


@dataclass(frozen=True)
class SystemdSpec:
    unit: str  # e.g. "sglang.service"
    url: str  # the server's HTTP address, for readiness
    scope: str = "system"  # "system" or "user" (systemctl --user)
    ssh_host: str | None = None  # run everything on this host over SSH ("user@gpu-host")
    ssh_options: list[str] = field(default_factory=list)
    sudo: bool = False  # prefix commands with `sudo -n` (non-interactive)
    dropin_dir: str | None = None  # where UNIT.d/ lives; default by scope
    ready_timeout_s: float = 1800.0  # on the clock: a large model takes many minutes to load
    command_timeout_s: float = 180.0  # wall seconds for one systemctl/journalctl/ssh call
    engine: Engine = field(default_factory=default_engine)  # whose signatures to read


@dataclass(frozen=True)
class Completed:
    code: int
    out: str
    err: str


@dataclass(frozen=True)
class Invocation:
    """What identifies one start of the unit, to notice that it ended or was restarted."""

    invocation_id: str
    restarts: int


class Shell:
    """Runs argument vectors on the unit's host: locally, or over SSH (BatchMode, no prompts)."""

    def __init__(self, spec: SystemdSpec) -> None:
        self.spec = spec

    @property
    def where(self) -> str:
        return f" on {self.spec.ssh_host}" if self.spec.ssh_host else ""

    def argv(self, argv: list[str]) -> list[str]:
        if self.spec.sudo:
            argv = ["sudo", "-n", *argv]
        if self.spec.ssh_host:
            return [
                "ssh",
                "-o",
                "BatchMode=yes",
                "-o",
                "ConnectTimeout=15",
                *self.spec.ssh_options,
                "--",  # whatever follows is the host, never an option
                self.spec.ssh_host,
                shlex.join(argv),
            ]
        return argv

    def run(self, argv: list[str], stdin: str | None = None) -> Completed:
        full = self.argv(argv)
        try:
            done = subprocess.run(
                full,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=self.spec.command_timeout_s,
                check=False,
            )
        except FileNotFoundError:
            raise LaunchError(
                f"`{full[0]}` is not installed here; the systemd launcher needs it"
                + (" (ssh, to reach the GPU host)" if self.spec.ssh_host else "")
            ) from None
        except subprocess.TimeoutExpired:
            raise LaunchError(
                f"`{shlex.join(argv)}`{self.where} did not finish within "
                f"{self.spec.command_timeout_s:g} s"
            ) from None
        if self.spec.ssh_host and done.returncode == 255:
            raise LaunchError(
                f"cannot reach {self.spec.ssh_host} over SSH: {done.stderr.strip()} "
                "(kvpilot uses key authentication without prompts: check ssh_host, the key and "
                "known_hosts)"
            )
        return Completed(done.returncode, done.stdout, done.stderr)

    def write_file(self, path: str, text: str) -> None:
        target = PurePosixPath(path)
        tmp = target.with_name(f".{target.name}.tmp")
        done = self.run(
            ["sh", "-c", _WRITE_SCRIPT, "kvpilot-write", str(target.parent), str(tmp), path],
            stdin=text,
        )
        if done.code != 0:
            raise LaunchError(f"cannot write {path}{self.where}: {done.err.strip()}")

    def remove_file(self, path: str) -> None:
        done = self.run(["rm", "-f", "--", path])
        if done.code != 0:
            raise LaunchError(f"cannot remove {path}{self.where}: {done.err.strip()}")

    def home(self) -> str:
        done = self.run(["sh", "-c", 'printf %s "$HOME"'])
        if done.code != 0 or not done.out.startswith("/"):
            raise LaunchError(f"cannot find the home directory{self.where}: {done.err.strip()}")
        return done.out


class SystemdLauncher(StartThenWait[SystemdSpec]):
    kind = "systemd"

    def __init__(
        self, spec: SystemdSpec, clock: Clock | None = None, shell: Shell | None = None
    ) -> None:
        self.spec = spec
        self.clock = clock or WallClock()
        self.shell = shell or Shell(spec)
        self._started: Invocation | None = None
        self._dropin_dir: str | None = spec.dropin_dir

    # ----------------------------------------------------------------- the system
    def _systemctl(self, *args: str) -> Completed:
        scope = ["--user"] if self.spec.scope == "user" else []
        return self.shell.run(["systemctl", *scope, "--no-pager", *args])

    def _checked(self, *args: str) -> str:
        done = self._systemctl(*args)
        if done.code != 0:
            raise LaunchError(
                f"`systemctl {' '.join(args)}`{self.shell.where} failed: "
                f"{(done.err or done.out).strip()}"
            )
        return done.out

    def dropin_path(self) -> str:
        if self._dropin_dir is None:
            if self.spec.scope == "user":
                self._dropin_dir = f"{self.shell.home()}/{USER_DROPIN_ROOT}"
            else:
                self._dropin_dir = SYSTEM_DROPIN_ROOT
        return f"{self._dropin_dir}/{self.spec.unit}.d/{DROPIN_NAME}"

    def unit_files(self) -> list[UnitFile]:
        done = self._systemctl("cat", "--", self.spec.unit)
        if done.code != 0:
            raise LaunchError(
                f"cannot read the unit {self.spec.unit}{self.shell.where}: "
                f"{(done.err or done.out).strip()} (is the unit installed, and is the scope "
                f"{self.spec.scope!r} right?)"
            )
        return split_cat_output(done.out, self.spec.unit)

    def _exec(self, files: list[UnitFile], skip: str | None = None) -> ExecCommand:
        try:
            command = effective_exec_start(files, skip)
        except UnitSyntaxError as exc:
            raise LaunchError(f"{self.spec.unit}: {exc}") from None
        if command is None:
            raise LaunchError(f"{self.spec.unit} has no ExecStart= to run SGLang with")
        return command

    def properties(self) -> dict[str, str]:
        out = self._checked(
            "show", f"--property={','.join(STATE_PROPERTIES)}", "--", self.spec.unit
        )
        props: dict[str, str] = {}
        for line in out.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                props[key] = value
        return props

    def journal(self, invocation_id: str | None, lines: int = 400) -> str:
        """The log of one invocation of the unit (SGLang's output and systemd's own lines)."""
        done = self.shell.run(
            ["journalctl", *self._journal_matches(), "--no-pager", "-o", "json", "-n", str(lines)]
        )
        if done.code != 0:
            return f"(journalctl failed: {done.err.strip()})"
        messages: list[str] = []
        for line in done.out.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if not isinstance(entry, dict):
                continue
            ids = {
                entry.get(k)
                for k in ("_SYSTEMD_INVOCATION_ID", "INVOCATION_ID", "USER_INVOCATION_ID")
            }
            if invocation_id and ids != {None} and invocation_id not in ids:
                continue
            messages.append(_message_text(entry.get("MESSAGE")))
        return tail("\n".join(messages))

    def _journal_matches(self) -> list[str]:
        """Which journal entries are the unit's.

        `journalctl -u` takes `UNIT=` only from PID 1 (systemd's logs-show.c,
        add_matches_for_unit), but the line that says why a start failed ("Failed to locate
        executable ...") comes from the forked child, with `UNIT=`, and journald adds
        `_SYSTEMD_UNIT` only if it reads the sender's cgroup in time: a busy host lost it. So a
        system unit's entries are those of either field (tests/real_daemons, real systemd 252).
        """
        if self.spec.scope == "user":
            return ["--user", "-u", self.spec.unit]
        return [f"_SYSTEMD_UNIT={self.spec.unit}", "+", f"UNIT={self.spec.unit}"]

    def permissions(self) -> list[Finding]:
        """The unit is loaded and runs a command, its drop-in can be written, and this user
        may restart it and reload systemd (root, sudo, polkit, or the user manager)."""
        try:
            props = self.properties()
            if props.get("LoadState") != "loaded":
                return [
                    Finding(
                        False,
                        f"unit {self.spec.unit}{self.shell.where} is {props.get('LoadState')}",
                        "install the unit (deploy/systemd/sglang.service is an example), or fix "
                        "unit and scope in [servers.NAME.launcher]",
                    )
                ]
            exe, _ = split_command(self._exec(self.unit_files()).argv)
            dropin = self.dropin_path()
            done = self.shell.run(
                [
                    "sh",
                    "-c",
                    _CHECK_SCRIPT,
                    "kvpilot-check",
                    str(PurePosixPath(dropin).parent),
                    self.spec.unit,
                ]
            )
        except LaunchError as exc:
            return [Finding(False, exc.reason)]
        found = [Finding(True, f"unit {self.spec.unit}{self.shell.where} runs {' '.join(exe)}")]
        lines = done.out.split()
        if done.code != 0 or len(lines) < 5:
            how = "`sudo -n`" if self.spec.sudo else "a shell"
            return [
                *found,
                Finding(
                    False,
                    f"cannot check the rights to change it through {how}{self.shell.where}: "
                    f"{(done.err or done.out).strip()}",
                    "a sudoers rule with NOPASSWD for kvpilot's commands (docs/launchers.md)"
                    if self.spec.sudo
                    else "",
                ),
            ]
        state, where, uid, manage, reload = lines[:5]
        if state != "writable":
            found.append(
                Finding(
                    False,
                    f"its drop-in {dropin} cannot be written{self.shell.where} ({where} is not "
                    "writable for this user)",
                    "under deploy/systemd/kvpilot.service, add the directory to ReadWritePaths=; "
                    "otherwise run as root or with sudo = true",
                )
            )
        number = [int(w) if w.isdigit() else -1 for w in (uid, manage, reload)]
        found.append(authority(self.spec.scope, *number))
        return found

    # ----------------------------------------------------------------- interface
    def current_args(self) -> list[str]:
        return split_command(self._exec(self.unit_files()).argv)[1]

    def state(self) -> ServerState:
        props = self.properties()
        if props.get("LoadState") != "loaded":
            return ServerState(
                False, False, None, None, f"unit {self.spec.unit} is {props.get('LoadState')}"
            )
        pid = _int(props.get("MainPID")) or None
        active = props.get("ActiveState")
        if active in ("active", "reloading") and pid is not None:
            ready = health_ok(self.spec.url, self.spec.engine)
            return ServerState(True, ready, pid, None, "" if ready else "starting or not ready")
        code = exit_code(props)
        if active == "inactive" and props.get("Result") == "success":
            return ServerState(False, False, pid, code, "stopped")
        if active == "activating" and props.get("SubState") != "auto-restart":
            return ServerState(False, False, pid, code, "starting")
        cause = self._why(code, self.journal(props.get("InvocationID")), props)
        reason = cause.reason
        if props.get("SubState") == "auto-restart":
            reason += f" (systemd restarts it: restart {props.get('NRestarts', '?')})"
        return ServerState(False, False, pid, code, reason, cause)

    def start(self, args: list[str]) -> None:
        self.install(args)
        done = self._systemctl("restart", "--", self.spec.unit)
        props = self.properties()
        if done.code != 0:
            log = self.journal(props.get("InvocationID"))
            raise LaunchError(
                f"`systemctl restart {self.spec.unit}`{self.shell.where} failed: "
                f"{(done.err or done.out).strip()} "
                f"({self._why(exit_code(props), log, props).reason})",
                log,
            )
        self._started = self._invocation(props)

    def install(self, args: list[str]) -> None:
        """Make `args` the unit's SGLang arguments: a drop-in, or none when the unit's own match."""
        files = self.unit_files()
        ours = self.dropin_path()
        base = self._exec(files, skip=ours)
        exe, _ = split_command(base.argv)
        target = ExecCommand(base.prefix, [*exe, *args])
        if target == base:
            if any(f.path == ours for f in files):
                self.shell.remove_file(ours)
        else:
            self.shell.write_file(ours, render_dropin(target))
        self._checked("daemon-reload")
        files = self.unit_files()
        now = self._exec(files)
        if now.argv != target.argv:
            others = [f.path for f in files[1:] if f.path != ours]
            raise LaunchError(
                f"{self.spec.unit}: kvpilot's drop-in {ours} was written, but systemd runs "
                f"another command ({' '.join(now.argv)}): a drop-in applied after it sets "
                f"ExecStart= again ({', '.join(others) or 'see `systemctl cat`'})"
            )

    def poll_ready(self) -> bool:
        """One look at the invocation started last (on a fresh launcher: the one running now)."""
        props = self.properties()
        if self._started is None:
            self._started = self._invocation(props)
        started = self._started
        if _ended(props, started):
            log = self.journal(started.invocation_id)
            cause = self._why(exit_code(props), log, props)
            self._stop_quietly()
            raise LaunchError(
                f"{self.spec.unit} exited before it was ready: {cause.reason}", log, cause=cause
            )
        return health_ok(self.spec.url, self.spec.engine)

    def give_up(self) -> str:
        """Stopped, so that `Restart=` does not keep a start that never got ready going; the
        journal of its invocation, read before."""
        started = self._started or self._invocation(self.properties())
        log = self.journal(started.invocation_id)
        self._stop_quietly()
        return log

    def wait_ready(self) -> None:
        if not poll_until(self.clock, self.spec.ready_timeout_s, self.poll_ready):
            raise still_starting(
                self.spec.unit, self.spec.ready_timeout_s, self.give_up(), "it was stopped"
            )

    def identity(self) -> ServerIdentity | None:
        # A remote host's zone abbreviation may name another zone than ours ("CST").
        zones = () if self.spec.ssh_host else tuple(time.tzname)
        return unit_identity(self.properties(), zones)

    def stop(self) -> None:
        self._checked("stop", "--", self.spec.unit)

    # ----------------------------------------------------------------- helpers
    def _why(self, code: int | None, log: str, props: dict[str, str]) -> ExitCause:
        """systemd's own failure to run the command, the kernel's OOM killer as systemd saw it
        (`Result=oom-kill`), or the engine's reading of its end."""
        unstarted = systemd_failure(code, log)
        if unstarted is not None:
            return ExitCause(Failure.crashed, unstarted)
        if props.get("Result") == "oom-kill":
            return ExitCause(
                Failure.out_of_memory,
                "killed by the kernel's OOM killer (systemd: Result=oom-kill; the unit's "
                "MemoryMax= or host RAM)",
            )
        return self.spec.engine.exit_cause(code, log)

    def _invocation(self, props: dict[str, str]) -> Invocation:
        return Invocation(props.get("InvocationID", ""), _int(props.get("NRestarts")))

    def _stop_quietly(self) -> None:
        self._systemctl("stop", "--", self.spec.unit)


def authority(scope: str, uid: int, manage: int, reload: int) -> Finding:
    """May this user restart the unit and reload systemd? `manage` and `reload` are pkcheck's
    exit statuses for the two actions (127: polkit is not installed)."""
    if scope == "user":
        return Finding(True, "a user unit: its own manager needs no authorisation")
    if uid == 0:
        return Finding(True, "restarts as root")
    if manage == 0 and reload == 0:
        return Finding(True, "polkit allows this user to restart it and reload systemd")
    if manage == 127:
        detail = "not root, and polkit is not installed: systemd lets only root restart it"
    else:
        said = {1: "refused", 2: "asks for a password", 3: "dismissed"}
        denied = [
            f"{action} {said.get(code, f'failed ({code})')}"
            for action, code in (("manage-units", manage), ("reload-daemon", reload))
            if code != 0
        ]
        detail = f"polkit does not let this user restart it: {', '.join(denied)}"
    return Finding(False, detail, POLKIT_FIX)


def unit_identity(props: dict[str, str], local_zones: tuple[str, ...]) -> ServerIdentity | None:
    """The running main process: systemd gives every start (kvpilot's, an operator's, a
    `Restart=` after a crash) a new InvocationID and a new ExecMainStartTimestampMonotonic."""
    pid = _int(props.get("MainPID"))
    if props.get("ActiveState") not in ("active", "reloading") or pid <= 0:
        return None
    invocation = props.get("InvocationID", "")
    spawned = props.get("ExecMainStartTimestampMonotonic", "")
    return ServerIdentity(
        f"{invocation}/{spawned}",
        systemd_timestamp(props.get("ExecMainStartTimestamp", ""), local_zones),
        f"invocation {invocation}, MainPID {pid}",
    )


def systemd_timestamp(text: str, local_zones: tuple[str, ...]) -> float | None:
    """Epoch seconds of a `systemctl show` timestamp, None when unset or its zone is unknown.

    systemd prints local time with the zone's abbreviation (src/basic/time-util.c,
    format_timestamp: "%a %Y-%m-%d %H:%M:%S %Z"), "@SECONDS" with `--timestamp=unix`, and
    nothing for "never". An abbreviation is exact only for UTC and `local_zones` (this host's,
    read as local time); the instance does not depend on it, so another zone leaves it None.
    """
    text = text.strip()
    if text.startswith("@"):
        try:
            return float(text[1:])
        except ValueError:
            return None
    words = text.split()
    if len(words) != 4:
        return None
    _, day, clock, zone = words
    try:
        naive = datetime.strptime(f"{day} {clock}", "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
    if zone in ("UTC", "GMT"):
        return naive.replace(tzinfo=UTC).timestamp()
    if zone in local_zones:
        return naive.timestamp()  # this host's local time
    return None


def exit_code(props: dict[str, str]) -> int | None:
    """The main process's end as `subprocess` reports it: status, or minus the signal."""
    how = _int(props.get("ExecMainCode"))
    status = _int(props.get("ExecMainStatus"))
    if how == CLD_EXITED:
        return status
    if how in (CLD_KILLED, CLD_DUMPED):
        return -status
    return None


def _ended(props: dict[str, str], started: Invocation) -> bool:
    """The invocation kvpilot started is over: failed, restarting, replaced or stopped."""
    return (
        props.get("ActiveState") in ("failed", "inactive", "deactivating")
        or props.get("SubState") == "auto-restart"
        or props.get("InvocationID", "") != started.invocation_id
        or _int(props.get("NRestarts")) > started.restarts
    )


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def _message_text(message: object) -> str:
    """journalctl's MESSAGE: a string, or a list of byte values when it is not valid UTF-8."""
    if isinstance(message, str):
        return message
    if isinstance(message, list) and all(isinstance(b, int) for b in message):
        return bytes(message).decode(errors="replace")
    return ""
