"""Run one `apply` the way the bot does, in a process a test can kill midway.

python -m tests.playbooks.launchers.apply_child CONFIG SERVER ARGS_JSON
"""

from __future__ import annotations

import json
import sys

from bot.app.config import load
from bot.app.wiring import launcher, make_clock


def main(argv: list[str]) -> int:
    config = load(argv[0])
    launcher(config, config.server(argv[1]), make_clock(config)).apply(json.loads(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
