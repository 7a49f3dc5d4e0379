"""kvpilot sim package."""
