"""Routers in front of a group: a server out of rotation before a restart, back in once ready.

Routers in front of a group of servers: take one out of rotation before kvpilot restarts it,
and put it back once it is ready again (`base.Router`; `sglang.py`, `vllm_stack.py`)."""
