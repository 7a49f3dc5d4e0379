"""Throughput reports for people: rendering, charts, the sampler that feeds them, schedules."""
