"""Launchers start, stop and reconfigure the servers (SGLang or vLLM) behind one interface."""
