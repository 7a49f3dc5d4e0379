"""The application's plumbing: configuration, wiring, logs, the terminal's identity and signals."""
