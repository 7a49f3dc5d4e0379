"""Probes outside the server: GPUs, host RAM, model configs, and where metrics come from."""
