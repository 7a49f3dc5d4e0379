"""Campaigns: one gated experiment after another on a server, until nothing useful is left."""
