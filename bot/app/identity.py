"""Who is at the terminal: the operating-system account running this process.

The name comes from the process's real uid through the password database, never from
`$USER` or `$LOGNAME`, which anyone can set (`USER=bob kvpilot ...` must not make you bob).
Whoever can write kvpilot's database file can also write approvals into it, so that file's
permissions are part of the access policy (docs/operations.md says how to set them).
"""

from __future__ import annotations

import os
import pwd

from bot.chat.auth import CLI_PREFIX


def os_user() -> str:
    """The login name of this process's real uid (`uid1234` if it has no passwd entry)."""
    uid = os.getuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid{uid}"


def terminal_actor() -> str:
    """The actor kvpilot's command line records: `cli:NAME`."""
    return CLI_PREFIX + os_user()
