"""kvpilot bot package."""
