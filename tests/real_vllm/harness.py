"""What the real-vLLM tests share: whether the environment is installed, and its Python.

The environment is `tests/real_vllm/setup.sh`'s venv (`$KVPILOT_VLLM_VENV`, default
`.venv-vllm`); its stamp file is written last, so a half-finished install counts as absent.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STAMP_NAME = ".kvpilot-vllm-installed"


def vllm_venv() -> Path:
    return Path(os.environ.get("KVPILOT_VLLM_VENV") or REPO / ".venv-vllm")


def vllm_python() -> Path:
    return vllm_venv() / "bin" / "python"


def vllm_env_available() -> bool:
    """True once setup.sh has completed (the venv's python and its stamp file exist)."""
    return vllm_python().exists() and (vllm_venv() / STAMP_NAME).is_file()


# The marks of every real-vLLM test module: its tier, and a skip naming the fix where the
# environment is not installed.
MARKS = [
    pytest.mark.real_vllm,
    pytest.mark.skipif(
        not vllm_env_available(),
        reason="real vLLM environment not installed (run tests/real_vllm/setup.sh)",
    ),
]
