"""A stand-in for systemd's service manager, `systemctl` and `journalctl`, for machines (and
containers) without a running systemd.

It keeps the parts the systemd launcher depends on, with systemd's behaviour:
- unit files under ROOT/usr/lib/systemd/system, drop-ins in ROOT/etc/systemd/system/UNIT.d/,
  sorted by file name; `ExecStart=` with an empty value resets the list;
- `daemon-reload` loads the files; `start` uses what was loaded, not what is on disk (so a
  forgotten reload runs the old command, and `NeedDaemonReload=yes` says so);
- a supervisor process per running unit plays the manager: it runs ExecStart (no shell), sends
  the output to the journal with the invocation's ID, records how the main process ended
  (`ExecMainCode`/`ExecMainStatus`), and applies `Restart=` with `RestartSec=` (NRestarts,
  `activating`/`auto-restart`), or leaves the unit `failed`;
- `stop` sends SIGTERM to the process group, SIGKILL after `TimeoutStopSec=`;
- `systemctl show` prints `Key=value` lines; `journalctl -o json` prints one JSON object a line
  with systemd's field names.

Tests put generated `systemctl`/`journalctl` executables first on PATH (see `install_tools`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from playbooks.launchers.systemd_exit import status_name
from tests.paths import REPO

CLD_EXITED, CLD_KILLED = 1, 2
IDLE = {
    "active": "inactive",
    "sub": "dead",
    "result": "success",
    "main_pid": 0,
    "code": 0,
    "status": 0,
    "n_restarts": 0,
    "invocation": "",
    "supervisor": 0,
    "start_realtime_us": 0,  # when the main process was spawned (CLOCK_REALTIME)
    "start_monotonic_us": 0,  # the same on CLOCK_MONOTONIC, as systemd records both
}


# --------------------------------------------------------------------------- files
def unit_dir(root: Path) -> Path:
    return root / "usr/lib/systemd/system"


def etc_dir(root: Path) -> Path:
    return root / "etc/systemd/system"


def unit_files(root: Path, unit: str) -> list[Path]:
    fragment = next(
        (d / unit for d in (etc_dir(root), unit_dir(root)) if (d / unit).exists()), None
    )
    if fragment is None:
        return []
    dropins: dict[str, Path] = {}
    for d in (unit_dir(root), etc_dir(root)):  # /etc wins for the same file name
        for f in sorted((d / f"{unit}.d").glob("*.conf")):
            dropins[f.name] = f
    return [fragment, *(dropins[name] for name in sorted(dropins))]


def assignments(text: str) -> list[tuple[str, str, str]]:
    out = []
    section = ""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        while line.endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line[:-1] + " " + lines[i].strip()
        i += 1
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.append((section, key.strip(), value.strip()))
    return out


def load_unit(root: Path, unit: str) -> dict[str, Any] | None:
    files = unit_files(root, unit)
    if not files:
        return None
    cfg: dict[str, Any] = {
        "exec_start": [],
        "restart": "no",
        "restart_sec": 0.1,
        "timeout_stop_sec": 90.0,
        "working_directory": None,
        "description": "",
        "environment": {},
        "paths": [str(f) for f in files],
        "mtimes": {str(f): f.stat().st_mtime_ns for f in files},
    }
    for f in files:
        for section, key, value in assignments(f.read_text()):
            if section == "Unit" and key == "Description":
                cfg["description"] = value
            if section != "Service":
                continue
            if key == "ExecStart":
                cfg["exec_start"] = [] if not value else [*cfg["exec_start"], value]
            elif key == "Restart":
                cfg["restart"] = value
            elif key == "RestartSec":
                cfg["restart_sec"] = float(value.rstrip("s"))
            elif key == "TimeoutStopSec":
                cfg["timeout_stop_sec"] = float(value.rstrip("s"))
            elif key == "WorkingDirectory":
                cfg["working_directory"] = value
            elif key == "Environment":
                for item in shlex.split(value):
                    name, _, val = item.partition("=")
                    cfg["environment"][name] = val
    return cfg


def expand(word: str, env: dict[str, str]) -> list[str]:
    """systemd's `$VAR` (split on whitespace when the whole word) and `${VAR}` expansion."""
    whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
    if whole:
        return env.get(whole.group(1), "").split()
    word = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), word)
    return [word.replace("$$", "$").replace("%%", "%")]


def exec_argv(cfg: dict[str, Any]) -> list[str]:
    value = cfg["exec_start"][0].lstrip("@-:+!|")
    env = {**os.environ, **cfg["environment"]}
    return [w for word in shlex.split(value) for w in expand(word, env)]


# --------------------------------------------------------------------------- state
def run_dir(root: Path) -> Path:
    path = root / "run"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def locked(root: Path, unit: str) -> Iterator[None]:
    with (run_dir(root) / f"{unit}.lock").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def read_json(path: Path, default: dict[str, Any] | None) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return default
    return data if isinstance(data, dict) else default


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def get_state(root: Path, unit: str) -> dict[str, Any]:
    state = read_json(run_dir(root) / f"{unit}.state.json", None)
    return dict(IDLE) if state is None else state


def update_state(root: Path, unit: str, **changes: Any) -> dict[str, Any]:
    with locked(root, unit):
        state = get_state(root, unit)
        state.update(changes)
        write_json(run_dir(root) / f"{unit}.state.json", state)
        return state


def loaded(root: Path, unit: str) -> dict[str, Any] | None:
    return read_json(run_dir(root) / f"{unit}.loaded.json", None)


# The manager's catalogued messages (systemd's src/systemd/sd-messages.h), as journalctl -o json
# gives them in MESSAGE_ID.
MESSAGE_IDS = {
    "started": "39f53479d3a045ac8e11786248231fbf",
    "exited": "98e322203f7a4ed290d09fe03c09fe15",
    "failed": "d9b373ed55a64feb8242e02dbe79a49c",
    "stopping": "de5b426a63be47a7b6ac3eaac82e2f6f",
    "deactivated": "7ad2d189f7e94e70a38c781354912448",
    "stopped": "9d1aaa27d60140bd96365438aad20286",
    "spawn_failed": "641257651c1b4ec9a8624d7a40a9e1e7",
}


def described(unit: str, cfg: dict[str, Any]) -> str:
    """How systemd 252 names a unit in its status lines: "UNIT - Description" when it has one."""
    return f"{unit} - {cfg['description']}" if cfg.get("description") else unit


def journal(
    root: Path, unit: str, message: str, invocation: str, pid: int, own: bool, kind: str = ""
) -> None:
    entry = {
        "__REALTIME_TIMESTAMP": str(time.time_ns() // 1000),
        "PRIORITY": "6",
        "MESSAGE": message,
        "_PID": str(pid),
    }
    if kind:
        entry["MESSAGE_ID"] = MESSAGE_IDS[kind]
    if own:  # the manager's own lines about the unit
        entry.update({"UNIT": unit, "INVOCATION_ID": invocation, "SYSLOG_IDENTIFIER": "systemd"})
    else:
        entry.update({"_SYSTEMD_UNIT": unit, "_SYSTEMD_INVOCATION_ID": invocation})
    with (root / "journal.jsonl").open("a") as f:
        f.write(json.dumps(entry) + "\n")


def alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
            return False
    return True


# --------------------------------------------------------------------------- the manager
def supervise(root: Path, unit: str) -> int:
    cfg = loaded(root, unit)
    assert cfg is not None
    stopping = threading.Event()
    child: subprocess.Popen[bytes] | None = None

    def on_term(signum: int, frame: object) -> None:
        stopping.set()
        if child is not None and child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGTERM)

            def escalate(proc: subprocess.Popen[bytes] = child) -> None:
                time.sleep(float(cfg["timeout_stop_sec"]))
                if proc.returncode is None:  # once reaped, its pid may be another process's
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)

            threading.Thread(target=escalate, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    while True:
        invocation = uuid.uuid4().hex
        argv = exec_argv(cfg)
        try:
            child = subprocess.Popen(
                argv,
                cwd=cfg["working_directory"],
                env={**os.environ, **cfg["environment"]},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            # Type=simple: the start job is done once systemd has forked; its child then fails
            # to execute, logs why under the unit and exits with EXIT_EXEC (203)
            child = None
            journal(root, unit, f"Started {described(unit, cfg)}.", invocation, 1, True, "started")
            # Those two lines come from the forked child (not PID 1) with UNIT=, and journald
            # may not read its cgroup in time to add _SYSTEMD_UNIT (seen on a busy host with
            # the real systemd 252): the case `journalctl -u` misses.
            for line in (
                f"{unit}: Failed to locate executable {argv[0]}: {exc.strerror}",
                f"{unit}: Failed at step EXEC spawning {argv[0]}: {exc.strerror}",
            ):
                journal(root, unit, line, invocation, os.getpid(), True, "spawn_failed")
            rc = 203
        else:
            update_state(
                root, unit, active="active", sub="running", result="success",
                main_pid=child.pid, code=0, status=0, invocation=invocation,
                supervisor=os.getpid(), start_realtime_us=time.time_ns() // 1000,
                start_monotonic_us=time.monotonic_ns() // 1000,
            )  # fmt: skip
            journal(root, unit, f"Started {described(unit, cfg)}.", invocation, 1, True, "started")
            assert child.stdout is not None
            for raw in child.stdout:
                text = raw.decode(errors="replace").rstrip("\n")
                journal(root, unit, text, invocation, child.pid, False)
            rc = child.wait()
        killed = rc < 0
        code, status = (CLD_KILLED, -rc) if killed else (CLD_EXITED, rc)
        if stopping.is_set():
            # a unit stopped cleanly is unloaded by systemd's garbage collection: its next
            # `show` has no invocation and no exit status (observed on systemd 252)
            journal(root, unit, f"{unit}: Deactivated successfully.", invocation, 1, True,
                    "deactivated")  # fmt: skip
            journal(root, unit, f"Stopped {described(unit, cfg)}.", invocation, 1, True, "stopped")
            with locked(root, unit):
                write_json(run_dir(root) / f"{unit}.state.json", dict(IDLE))
            return 0
        name = signal.Signals(status).name.removeprefix("SIG") if killed else status_name(rc)
        how = f"code={'killed' if killed else 'exited'}, status={status}" + (
            f"/{name}" if name else ""
        )
        journal(root, unit, f"{unit}: Main process exited, {how}", invocation, 1, True, "exited")
        result = "signal" if killed else ("exit-code" if rc else "success")
        failed = rc != 0
        if failed:
            journal(
                root, unit, f"{unit}: Failed with result '{result}'.", invocation, 1, True, "failed"
            )
        restart = (
            cfg["restart"] == "always"
            or (failed and cfg["restart"] == "on-failure")
            or (killed and cfg["restart"] == "on-abnormal")
        )
        if not restart:
            update_state(
                root, unit, active="failed" if failed else "inactive",
                sub="failed" if failed else "dead", result=result, main_pid=0, code=code,
                status=status, supervisor=0, invocation=invocation,
            )  # fmt: skip
            return 0
        update_state(
            root, unit, active="activating", sub="auto-restart", result=result, main_pid=0,
            code=code, status=status, invocation=invocation,
        )  # fmt: skip
        deadline = time.monotonic() + float(cfg["restart_sec"])
        while time.monotonic() < deadline and not stopping.is_set():
            time.sleep(0.02)
        if stopping.is_set():
            with locked(root, unit):
                write_json(run_dir(root) / f"{unit}.state.json", dict(IDLE))
            return 0
        restarts = int(get_state(root, unit)["n_restarts"]) + 1
        update_state(root, unit, n_restarts=restarts)
        journal(
            root, unit, f"{unit}: Scheduled restart job, restart counter is at {restarts}.",
            invocation, 1, True,
        )  # fmt: skip


def stop_unit(root: Path, unit: str) -> None:
    state = get_state(root, unit)
    sup = int(state.get("supervisor", 0))
    if alive(sup):
        os.kill(sup, signal.SIGTERM)
        while alive(sup):
            time.sleep(0.01)
    state = get_state(root, unit)
    if state["active"] in ("active", "activating", "deactivating"):
        update_state(root, unit, active="inactive", sub="dead", main_pid=0, supervisor=0)


def start_unit(root: Path, unit: str) -> tuple[int, str]:
    cfg = loaded(root, unit)
    if cfg is None:
        return 5, f"Failed to start {unit}: Unit {unit} not found.\n"
    state = get_state(root, unit)
    if state["active"] == "active" and alive(int(state.get("supervisor", 0))):
        return 0, ""
    before = state["invocation"]
    subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.playbooks.launchers.fake_systemd",
            "supervise",
            str(root),
            unit,
        ],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        state = get_state(root, unit)
        if state["invocation"] != before:
            return 0, ""
        time.sleep(0.01)
    return 1, f"Job for {unit} timed out.\n"


def show_timestamp(usec: int) -> str:
    """A timestamp as `systemctl show` prints it: local time with the zone's abbreviation
    (format_timestamp, "Tue 2024-05-14 10:21:03 UTC"), nothing when it never happened."""
    if not usec:
        return ""
    return time.strftime("%a %Y-%m-%d %H:%M:%S %Z", time.localtime(usec / 1e6))


def show(root: Path, unit: str, props: list[str]) -> str:
    cfg = loaded(root, unit)
    state = get_state(root, unit)
    files = unit_files(root, unit)
    need_reload = cfg is not None and (
        [str(f) for f in files] != cfg["paths"]
        or any(f.stat().st_mtime_ns != cfg["mtimes"].get(str(f)) for f in files)
    )
    values = {
        "Id": unit,
        "LoadState": "loaded" if cfg is not None else "not-found",
        "ActiveState": state["active"],
        "SubState": state["sub"],
        "Result": state["result"],
        "MainPID": state["main_pid"],
        "ExecMainPID": state["main_pid"],
        "ExecMainCode": state["code"],
        "ExecMainStatus": state["status"],
        "NRestarts": state["n_restarts"],
        "InvocationID": state["invocation"],
        # kept after the process exits, until the next spawn, as systemd's ExecStatus is
        "ExecMainStartTimestamp": show_timestamp(int(state.get("start_realtime_us", 0))),
        "ExecMainStartTimestampMonotonic": int(state.get("start_monotonic_us", 0)),
        "Restart": cfg["restart"] if cfg else "no",
        "NeedDaemonReload": "yes" if need_reload else "no",
        "FragmentPath": cfg["paths"][0] if cfg else "",
        "DropInPaths": " ".join(cfg["paths"][1:]) if cfg else "",
    }
    return "".join(f"{p}={values.get(p, '')}\n" for p in props or list(values))


def cat(root: Path, unit: str) -> tuple[int, str, str]:
    files = unit_files(root, unit)
    if not files:
        return 1, "", f"No files found for {unit}.\n"
    parts = [f"# {f}\n{f.read_text().rstrip()}\n" for f in files]
    return 0, "\n".join(parts), ""


def systemctl(root: Path, argv: list[str]) -> tuple[int, str, str]:
    props: list[str] = []
    words: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg in ("--user", "--system", "--no-pager", "--quiet", "--"):
            continue
        if arg.startswith("--property="):
            props += arg.split("=", 1)[1].split(",")
        elif arg == "-p":
            props += next(args).split(",")
        elif arg.startswith("-"):
            return 1, "", f"systemctl: unrecognized option '{arg}'\n"
        else:
            words.append(arg)
    if not words:
        return 1, "", "systemctl: a command is needed\n"
    command, units = words[0], words[1:]
    if command == "daemon-reload":
        for path in sorted(unit_dir(root).glob("*.service")):
            cfg = load_unit(root, path.name)
            if cfg is not None:
                write_json(run_dir(root) / f"{path.name}.loaded.json", cfg)
        return 0, "", ""
    if len(units) != 1:
        return 1, "", f"systemctl {command}: one unit expected\n"
    unit = units[0]
    if command == "cat":
        return cat(root, unit)
    if command == "show":
        return 0, show(root, unit, props), ""
    if command == "is-active":
        active = get_state(root, unit)["active"]
        return (0 if active == "active" else 3), active + "\n", ""
    if command == "stop":
        stop_unit(root, unit)
        return 0, "", ""
    if command in ("start", "restart"):
        if command == "restart":
            stop_unit(root, unit)
        code, err = start_unit(root, unit)
        return code, "", err
    return 1, "", f"Unknown command verb {command}.\n"


def journalctl(root: Path, argv: list[str]) -> tuple[int, str, str]:
    unit, output, lines = None, "short", None
    fields: list[tuple[str, str]] = []  # FIELD=VALUE matches; "+" between them: any matches
    args = iter(argv)
    for arg in args:
        if arg in ("--user", "--system", "--no-pager", "-q", "--quiet", "+"):
            continue
        if "=" in arg and not arg.startswith("-"):
            field, _, value = arg.partition("=")
            fields.append((field, value))
        elif arg in ("-u", "--unit", "--user-unit"):
            unit = next(args)
        elif arg.startswith("--unit="):
            unit = arg.split("=", 1)[1]
        elif arg in ("-o", "--output"):
            output = next(args)
        elif arg in ("-n", "--lines"):
            lines = int(next(args))
        else:
            return 1, "", f"journalctl: unrecognized option '{arg}'\n"
    path = root / "journal.jsonl"
    entries = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    if unit is not None:  # -u: the unit's processes, and PID 1's lines about it (logs-show.c)
        entries = [
            e
            for e in entries
            if e.get("_SYSTEMD_UNIT") == unit or (e.get("UNIT") == unit and e.get("_PID") == "1")
        ]
    if fields:
        entries = [e for e in entries if any(e.get(f) == v for f, v in fields)]
    if lines is not None:
        entries = entries[-lines:] if lines else []
    if output == "json":
        return 0, "".join(json.dumps(e) + "\n" for e in entries), ""
    if output == "cat":
        return 0, "".join(e["MESSAGE"] + "\n" for e in entries), ""
    return 1, "", f"journalctl: output mode {output!r} is not supported here\n"


# --------------------------------------------------------------------------- install
TOOL_TEMPLATE = """#!{python} -S
import sys
sys.path.insert(0, {repo!r})
from tests.playbooks.launchers.fake_systemd import main
sys.exit(main({tool!r}, {root!r}, sys.argv[1:]))
"""


def install_tools(root: Path, bin_dir: Path) -> None:
    """Write `systemctl` and `journalctl` executables bound to `root` into `bin_dir`."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    repo = str(REPO)
    for tool in ("systemctl", "journalctl"):
        path = bin_dir / tool
        path.write_text(
            TOOL_TEMPLATE.format(python=sys.executable, repo=repo, tool=tool, root=str(root))
        )
        path.chmod(0o755)


def stop_all(root: Path) -> None:
    """Stop every unit this fake manager runs (test teardown)."""
    for path in run_dir(root).glob("*.state.json"):
        stop_unit(root, path.name.removesuffix(".state.json"))


def main(tool: str, root: str, argv: list[str]) -> int:
    base = Path(root)
    code, out, err = (systemctl if tool == "systemctl" else journalctl)(base, argv)
    sys.stdout.write(out)
    sys.stderr.write(err)
    return code


if __name__ == "__main__":
    if sys.argv[1] == "supervise":
        sys.exit(supervise(Path(sys.argv[2]), sys.argv[3]))
