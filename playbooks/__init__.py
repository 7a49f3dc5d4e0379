"""kvpilot playbooks package."""
