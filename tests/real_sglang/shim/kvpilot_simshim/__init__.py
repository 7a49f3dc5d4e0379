"""Run the real SGLang server on a CPU with a simulated GPU (see ../README.md)."""

from __future__ import annotations

import os

from . import hooks, patches, stubs

_STATE = {"installed": False}


def install() -> None:
    """Install the module stubs and the post-import patch hooks (idempotent)."""
    if _STATE["installed"]:
        return
    _STATE["installed"] = True

    # CPU platform; the Rust radix core is left on unless overridden.
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

    stubs.install(os.environ.get("KVPILOT_SIM_STUB_MODULES", "sgl_kernel,torchvision"))
    hooks.install(patches.PATCHES)
