"""The engines kvpilot can drive, by configuration name (`engine = "sglang"`).

Product code outside `playbooks/engines/` reaches an engine only through this registry and the
types in `playbooks.engines.base`; an engine's own modules are its private business.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from playbooks.engines.base import Engine, Snapshot

DEFAULT = "sglang"
NAMES = ("sglang",)


class UnknownEngine(ValueError):
    pass


def engine_named(name: str) -> Engine:
    """The engine called `name` in configuration (raises UnknownEngine, naming the choices)."""
    if name == "sglang":
        from playbooks.engines.sglang import ENGINE  # noqa: PLC0415 - loaded when first asked

        return ENGINE
    raise UnknownEngine(f"unknown engine {name!r}; kvpilot drives: {', '.join(NAMES)}")


def default_engine() -> Engine:
    return engine_named(DEFAULT)


def restore_snapshot(stored: Mapping[str, Any], t: float = 0.0) -> Snapshot:
    """A stored sample read back. Rows stored before the engine seam are SGLang's (the only
    engine there was), in its own metric names."""
    if "v" in stored:
        return Snapshot.from_json(stored, t)
    return engine_named("sglang").restore_snapshot(stored, t)
