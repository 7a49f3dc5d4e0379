"""Launchers start, stop and reconfigure SGLang servers behind one interface."""
