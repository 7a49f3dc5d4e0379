"""The Slack front end: the Bolt app, its surface and Block Kit, and `kvpilot serve`."""
