"""One call's shared state: its machine, settings, clock and what earlier phases measured."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.real_gpu.plan import Costs, Settings
from tests.real_gpu.server import Machine


@dataclass
class Call:
    machine: Machine
    settings: Settings
    work: Path  # this call's folder: kvpilot's configuration, database and state
    say: Callable[[str], None]
    deadline: float  # time.monotonic() by which every phase must have ended
    costs: Costs = field(default_factory=Costs)
    # the capacity record of smoke's server, which the capacity phase does not start again
    smoke_server: dict[str, Any] | None = None

    def left_s(self) -> float:
        return self.deadline - time.monotonic()


def find_key(data: Any, key: str) -> Any:
    """The first value of `key` in nested dicts and lists (SGLang moved fields of its server
    info between releases: top level, `internal_states`, ...), or None."""
    if isinstance(data, Mapping):
        if key in data:
            return data[key]
        values: list[Any] = list(data.values())
    elif isinstance(data, list):
        values = data
    else:
        return None
    for value in values:
        found = find_key(value, key)
        if found is not None:
            return found
    return None
