"""`kvpilot files NAME`: the deployment files kvpilot ships, printed, for an installed package.

The wheel installs them under its environment's `share/kvpilot/` (pyproject.toml's data files);
a checkout has them in `deploy/`. Printing them (`kvpilot files slack-manifest > manifest.yaml`)
is all an operator needs from them: each is a template to paste or edit.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

# name -> where it is in a checkout (under deploy/) and in an installed environment's share/
FILES = {
    "slack-manifest": "slack/manifest.yaml",
    "systemd-unit": "systemd/kvpilot.service",
    "systemd-env": "systemd/kvpilot.env.example",
}
CHECKOUT = Path(__file__).resolve().parents[2] / "deploy"
INSTALLED = Path(sys.prefix) / "share" / "kvpilot"


def find(name: str) -> Path | None:
    """The file's copy: the installed environment's, else the checkout's (None: neither)."""
    for top in (INSTALLED, CHECKOUT):
        path = top / FILES[name]
        if path.is_file():
            return path
    return None


def show(name: str, out: TextIO, err: TextIO) -> int:
    path = find(name)
    if path is None:
        err.write(
            f"error: {FILES[name]} is neither in {INSTALLED} nor in a checkout's deploy/: "
            "reinstall kvpilot, or take it from the source (deploy/)\n"
        )
        return 1
    out.write(path.read_text())
    return 0
