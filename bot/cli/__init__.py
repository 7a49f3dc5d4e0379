"""The `kvpilot` command line (`python -m bot.cli`, or the `kvpilot` script).

`app` parses and dispatches; `experiments` holds the experiment commands, `report` the report
command, `exit_codes` the one table of exit statuses.
"""

from bot.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
