"""Permissive stand-ins for packages that cannot be installed on a CPU-only box.

``sgl_kernel`` (CUDA kernels; on the CPU engine SGLang imports ``*_cpu`` ops from it at import time)
and ``torchvision`` (the PyPI wheel is CUDA-linked) are replaced by modules whose every attribute is
a stub class. A stub can be subclassed, called (returns a stub instance) and chained. The simulated
forward pass never reaches any of them.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any


class _StubMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _make_stub(f"{cls.__qualname__}.{name}")

    def __bool__(cls) -> bool:
        return False

    def __iter__(cls) -> Any:
        return iter(())

    def __or__(cls, other: Any) -> Any:
        return cls

    __ror__ = __or__


class _StubBase(metaclass=_StubMeta):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _make_stub(f"{type(self).__qualname__}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _make_stub(f"{type(self).__qualname__}()")()


def _make_stub(qualname: str) -> type:
    cls = _StubMeta(qualname.rsplit(".", 1)[-1], (_StubBase,), {})
    cls.__qualname__ = qualname
    return cls


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        stub = _make_stub(f"{self.__name__}.{name}")
        setattr(self, name, stub)
        return stub


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []  # a package, so any submodule can be imported too
        module.__version__ = "0.0.0+kvpilot.stub"  # type: ignore[attr-defined]
        module.__kvpilot_stub__ = True  # type: ignore[attr-defined]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class _StubFinder(importlib.abc.MetaPathFinder):
    def __init__(self, roots: set[str]) -> None:
        self.roots = roots
        self.loader = _StubLoader()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.split(".", 1)[0] not in self.roots:
            return None
        return importlib.machinery.ModuleSpec(fullname, self.loader, is_package=True)


def install(names: str) -> None:
    roots = {n.strip() for n in names.split(",") if n.strip()}
    if roots and not any(isinstance(f, _StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _StubFinder(roots))
