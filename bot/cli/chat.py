"""The chat service whose IDs kvpilot.toml holds: Slack's, which `kvpilot serve` speaks.

Every command reads the file with this identity part (`bot.chat.identity`), so a mistyped ID
is named the same way by `kvpilot serve`, the console and the command line.
"""

from bot.slack.identity import SLACK

CHAT_IDS = SLACK
