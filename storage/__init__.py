"""kvpilot storage package."""
