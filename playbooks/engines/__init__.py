"""The engines kvpilot can drive, by configuration name (`engine = "sglang"`).

Product code outside `playbooks/engines/` reaches an engine only through this registry and the
types in `playbooks.engines.base`; an engine's own modules are its private business.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any

from playbooks.engines.base import Engine, EngineClient, ServerSettings, Snapshot, WrongEngine

DEFAULT = "sglang"
# name -> the module whose `ENGINE` it is, imported when first asked; detect() asks them in
# this order. Adding an engine is one entry here.
ENGINES: dict[str, str] = {
    "sglang": "playbooks.engines.sglang",
    "vllm": "playbooks.engines.vllm",
}
NAMES = tuple(ENGINES)


class UnknownEngine(ValueError):
    pass


def engine_named(name: str) -> Engine:
    """The engine called `name` in configuration (raises UnknownEngine, naming the choices)."""
    module = ENGINES.get(name)
    if module is None:
        raise UnknownEngine(f"unknown engine {name!r}; kvpilot drives: {', '.join(ENGINES)}")
    engine: Engine = import_module(module).ENGINE
    return engine


def default_engine() -> Engine:
    return engine_named(DEFAULT)


def detect(
    url: str,
    *,
    api_key: str | None = None,
    timeout_s: float = 10.0,
    clock: Callable[[], float] | None = None,
) -> EngineClient:
    """A client for whichever engine answers at `url`: each is asked for its settings in turn.

    Raises the first engine's error when none recognises the server (an unreachable or
    unauthorised server is reported as such at once, not tried against every engine). With one
    engine there is nothing to tell apart: its client is returned unprobed, and a server that is
    not that engine says so at its first read, without a request spent on detection.
    """
    if len(NAMES) == 1:
        return engine_named(NAMES[0]).connect(
            url, api_key=api_key, timeout_s=timeout_s, clock=clock
        )
    first: WrongEngine | None = None
    for name in NAMES:
        client = engine_named(name).connect(url, api_key=api_key, timeout_s=timeout_s, clock=clock)
        try:
            client.settings()
            return client
        except WrongEngine as exc:
            client.close()
            first = first or exc
        except BaseException:
            client.close()
            raise
    assert first is not None
    raise first


def restore_snapshot(stored: Mapping[str, Any], t: float = 0.0) -> Snapshot:
    """A stored sample read back. Rows stored before the engine seam are SGLang's (the only
    engine there was), in its own metric names."""
    if "v" in stored:
        return Snapshot.from_json(stored, t)
    return engine_named("sglang").restore_snapshot(stored, t)


def announced_time_scale(settings: ServerSettings) -> float | None:
    """How many times faster than real time the server says it runs: kvpilot's twin announces
    it (`kvpilot_twin.time_scale` in its server info); a real engine says nothing (None). The
    rates kvpilot reads on its own clock are that many times too high unless `[kvpilot]
    time_scale` matches."""
    twin = settings.raw.get("kvpilot_twin") if isinstance(settings.raw, dict) else None
    scale = twin.get("time_scale") if isinstance(twin, dict) else None
    return float(scale) if isinstance(scale, (int, float)) and scale > 0 else None
