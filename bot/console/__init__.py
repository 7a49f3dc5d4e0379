"""The terminal front end (`kvpilot console`) and `make demo`."""
