"""Post-import hooks: run a patch function right after a named module has executed.

Patching at import time (rather than from a wrapper script) means the same patches apply in the
spawned scheduler and detokenizer processes, and functions that other modules import by name (such
as ``get_device_memory_capacity``) are replaced before anyone copies them.
"""

from __future__ import annotations

import importlib.abc
import logging
import sys
import types
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("kvpilot_simshim")

PatchFn = Callable[[types.ModuleType], None]


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, inner: Any, name: str, patch: PatchFn) -> None:
        self._inner = inner
        self._name = name
        self._patch = patch

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._inner.exec_module(module)
        self._patch(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _PatchFinder(importlib.abc.MetaPathFinder):
    def __init__(self, patches: dict[str, PatchFn]) -> None:
        self._patches = patches
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        patch = self._patches.get(fullname)
        if patch is None or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.discard(fullname)
        if spec.loader is None:
            return spec
        spec.loader = _PatchingLoader(spec.loader, fullname, patch)
        return spec


def install(patches: dict[str, PatchFn]) -> None:
    already = [name for name in patches if name in sys.modules]
    for name in already:  # imported before the hook existed (not expected): patch in place
        patches[name](sys.modules[name])
    sys.meta_path.insert(0, _PatchFinder(patches))
