"""What kvpilot does to servers: engines, diagnosis, gate, experiments, campaigns, launchers."""
