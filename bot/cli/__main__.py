"""`python -m bot.cli`: the same as the `kvpilot` script."""

import sys

from bot.cli.app import main

sys.exit(main())
