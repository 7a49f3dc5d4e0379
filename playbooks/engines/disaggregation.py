"""Prefill/decode disaggregated nodes, which kvpilot does not advise yet.

A decode node reserves KV for requests still arriving from a prefill node and admits them from
its transfer queues; a prefill node keeps KV until the decode node has taken it. kvpilot's
bottleneck rules and capacity advice model a colocated server, so on such a node they would
read the wrong queue and propose the wrong room: diagnose says so in one line, with what a
judgement would need, and proposes nothing.
"""

from __future__ import annotations

ROLES = ("prefill", "decode")


def not_judged(role: str, engine: str, needs: str) -> str:
    """The one line diagnose gives instead of advice."""
    return (
        f"this is a {role} node of a prefill/decode disaggregated deployment ({engine}): kvpilot "
        f"does not judge disaggregated nodes yet and proposes nothing; a judgement needs {needs}"
    )
