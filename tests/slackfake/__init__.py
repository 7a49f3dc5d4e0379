"""A local Slack-compatible server (Web API, response_urls, uploads, Socket Mode) for tests."""

from tests.slackfake.fake import FakeSlack
from tests.slackfake.state import BOT_ID, BOT_USER_ID, TEAM_ID, Call, UploadedFile

__all__ = ["BOT_ID", "BOT_USER_ID", "TEAM_ID", "Call", "FakeSlack", "UploadedFile"]
