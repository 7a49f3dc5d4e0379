"""The chat services whose IDs kvpilot.toml may hold: `[kvpilot] chat` picks one, Slack's default.

Every command reads the file with this (`bot.app.front_ends.CHATS`: each front end's identity
by name), so a mistyped ID is named the same way by `kvpilot serve`, the console and the
command line.
"""

from bot.app.front_ends import CHATS

CHAT_IDS = CHATS
