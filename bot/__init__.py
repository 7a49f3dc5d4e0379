"""The bot: chat core, front ends (Slack, terminal, command line), reports and plumbing."""
