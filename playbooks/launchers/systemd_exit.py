"""systemd's own exit statuses (200-243): systemd failed to set the unit up, the server never ran.

systemd's own exit statuses: a unit's main process that ends with 200-243 never ran the
server's code, systemd failed to set it up (no such executable, a user that does not exist, a
sandbox option the kernel refuses). Reading them as the server's own exit ("exited with status
203") sends an operator to the engine's log, where there is nothing.

Names and numbers: systemd's src/basic/exit-status.h and src/shared/exit-status.c (v252; 223
and 234 are retired). systemd prints them in its journal lines as "status=203/EXEC".
"""

from __future__ import annotations

import re

SYSTEMD_STATUS: dict[int, str] = {
    200: "CHDIR", 201: "NICE", 202: "FDS", 203: "EXEC", 204: "MEMORY", 205: "LIMITS",
    206: "OOM_ADJUST", 207: "SIGNAL_MASK", 208: "STDIN", 209: "STDOUT", 210: "CHROOT",
    211: "IOPRIO", 212: "TIMERSLACK", 213: "SECUREBITS", 214: "SETSCHEDULER",
    215: "CPUAFFINITY", 216: "GROUP", 217: "USER", 218: "CAPABILITIES", 219: "CGROUP",
    220: "SETSID", 221: "CONFIRM", 222: "STDERR", 224: "PAM", 225: "NETWORK",
    226: "NAMESPACE", 227: "NO_NEW_PRIVILEGES", 228: "SECCOMP", 229: "SELINUX_CONTEXT",
    230: "PERSONALITY", 231: "APPARMOR", 232: "ADDRESS_FAMILIES", 233: "RUNTIME_DIRECTORY",
    235: "CHOWN", 236: "SMACK_PROCESS_LABEL", 237: "KEYRING", 238: "STATE_DIRECTORY",
    239: "CACHE_DIRECTORY", 240: "LOGS_DIRECTORY", 241: "CONFIGURATION_DIRECTORY",
    242: "NUMA_POLICY", 243: "CREDENTIALS",
}  # fmt: skip
# The other names systemd prints after an exit status (LSB and BSD codes, and libc's).
OTHER_STATUS: dict[int, str] = {
    0: "SUCCESS", 1: "FAILURE", 2: "INVALIDARGUMENT", 3: "NOTIMPLEMENTED", 4: "NOPERMISSION",
    5: "NOTINSTALLED", 6: "NOTCONFIGURED", 7: "NOTRUNNING", 64: "USAGE", 65: "DATAERR",
    66: "NOINPUT", 67: "NOUSER", 68: "NOHOST", 69: "UNAVAILABLE", 70: "SOFTWARE", 71: "OSERR",
    72: "OSFILE", 73: "CANTCREAT", 74: "IOERR", 75: "TEMPFAIL", 76: "PROTOCOL", 77: "NOPERM",
    78: "CONFIG", 255: "EXCEPTION",
}  # fmt: skip
_HINTS = {  # what to check, by status name
    "EXEC": "check that ExecStart='s program exists and is executable on the host",
    "CHDIR": "check that WorkingDirectory= exists on the host",
    "USER": "check that the unit's User= exists on the host",
    "GROUP": "check that the unit's Group= exists on the host",
    "NAMESPACE": "check the unit's sandboxing options (ProtectSystem=, ReadWritePaths= naming "
    "a path that does not exist, PrivateTmp=)",
}
# The executor's own lines about such a failure (src/core/execute.c).
_EXECUTOR_LINES = ("Failed to locate executable", "Failed at step", "Failed to set up")
_UNIT_PREFIX = re.compile(r"^[\w@.:\\-]+\.service: ")


def status_name(status: int) -> str:
    """systemd's name for an exit status, "" where it has none."""
    return SYSTEMD_STATUS.get(status) or OTHER_STATUS.get(status, "")


def systemd_failure(code: int | None, log: str) -> str | None:
    """Why the unit never ran the server, when systemd's own exit status says so; else None.
    The executor's journal line, when there is one, is the detail an operator needs."""
    if code is None or code not in SYSTEMD_STATUS:
        return None
    name = SYSTEMD_STATUS[code]
    said = [
        _UNIT_PREFIX.sub("", line.strip())
        for line in log.splitlines()
        if any(marker in line for marker in _EXECUTOR_LINES)
    ]
    fix = _HINTS.get(name, "see `systemctl status` and the unit's journal")
    detail = f": {said[0]}" if said else ""
    return f"systemd could not start the command ({code}/{name}){detail}; {fix}"
