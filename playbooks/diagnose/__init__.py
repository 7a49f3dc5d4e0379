"""Diagnosis: measuring a server honestly and judging what to change, one server or a group."""
