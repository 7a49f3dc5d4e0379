"""The conversation, transport-neutral: commands, authorisation, messages, rendering, runner."""
