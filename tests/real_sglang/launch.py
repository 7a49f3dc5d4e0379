"""Start the real SGLang server on this CPU, with the kvpilot shim simulating the GPU.

Usage (any Python 3.11+, no third-party packages needed)::

    python tests/real_sglang/launch.py [sglang server flags...]

It takes ordinary ``sglang.launch_server`` flags, fills in the CPU defaults that are missing
(``--device cpu --attention-backend torch_native --sampling-backend pytorch --disable-cuda-graph
--sleep-on-idle --load-format dummy --context-length 8192`` and ``--model-path`` = the generated
model directory), then replaces itself (``exec``, same PID) with
``$KVPILOT_SGLANG_VENV/bin/python -m sglang.launch_server ...`` with the shim on ``PYTHONPATH``.

Flags of this script (removed before SGLang sees the rest):

``--kvpilot-print``
    print the final command line and the environment it adds, then exit 0.

Environment: ``KVPILOT_SGLANG_VENV`` (default ``<repo>/.venv-sglang``),
``KVPILOT_SGLANG_MODEL_DIR`` (default ``$KVPILOT_SGLANG_VENV/kvpilot-model``) and the
``KVPILOT_SIM_*`` parameters of the shim (see ``shim/README.md``), which pass through unchanged.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SHIM_DIR = HERE / "shim"
MAKE_MODEL = HERE / "make_model.py"

DEFAULT_CONTEXT_LENGTH = 8192

# Flags added when absent: (flag, value or None for a switch).
CPU_DEFAULTS: tuple[tuple[str, str | None], ...] = (
    ("--device", "cpu"),
    ("--attention-backend", "torch_native"),
    ("--sampling-backend", "pytorch"),
    ("--disable-cuda-graph", None),
    ("--sleep-on-idle", None),
    ("--load-format", "dummy"),
    ("--context-length", str(DEFAULT_CONTEXT_LENGTH)),
)

# Alternative spellings SGLang accepts for the flags above.
ALIASES: dict[str, tuple[str, ...]] = {
    "--model-path": ("--model-path", "--model"),
    "--context-length": ("--context-length",),
}


class LaunchError(RuntimeError):
    """The SGLang environment is missing or unusable."""


def venv_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get("KVPILOT_SGLANG_VENV") or REPO / ".venv-sglang")


def venv_python(env: Mapping[str, str] | None = None) -> Path:
    return venv_dir(env) / "bin" / "python"


def model_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    raw = env.get("KVPILOT_SGLANG_MODEL_DIR")
    return Path(raw) if raw else venv_dir(env) / "kvpilot-model"


def has_flag(args: Sequence[str], flag: str) -> bool:
    names = ALIASES.get(flag, (flag,))
    return any(a in names or a.split("=", 1)[0] in names for a in args)


def with_defaults(args: Sequence[str], default_model: Path) -> list[str]:
    """``args`` plus every CPU default (and ``--model-path``) the caller did not give."""
    out = list(args)
    if not has_flag(out, "--model-path"):
        out += ["--model-path", str(default_model)]
    for flag, value in CPU_DEFAULTS:
        if not has_flag(out, flag):
            out += [flag] if value is None else [flag, value]
    return out


def shim_env(base: Mapping[str, str]) -> dict[str, str]:
    """The variables the server needs on top of ``base``."""
    pythonpath = str(SHIM_DIR)
    if base.get("PYTHONPATH"):
        pythonpath += os.pathsep + base["PYTHONPATH"]
    return {
        "KVPILOT_SIM_SHIM": "1",
        "PYTHONPATH": pythonpath,
        "SGLANG_USE_CPU_ENGINE": "1",
        "CUDA_VISIBLE_DEVICES": "",
        # One torch thread per process: the box has 2 cores and nothing heavy runs on them.
        "OMP_NUM_THREADS": base.get("OMP_NUM_THREADS", "1"),
        "TOKENIZERS_PARALLELISM": base.get("TOKENIZERS_PARALLELISM", "false"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }


def ensure_model(python: Path, target: Path) -> None:
    """Build the weightless model directory if it is missing or from an older recipe
    (``make_model.py`` returns at once when the directory is current)."""
    result = subprocess.run(
        [str(python), str(MAKE_MODEL), str(target)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise LaunchError(f"building the model directory failed:\n{result.stdout}")


def build_command(
    args: Sequence[str], env: Mapping[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """The argv and the full environment of the server process."""
    base = dict(os.environ if env is None else env)
    python = venv_python(base)
    if not python.exists():
        raise LaunchError(
            f"no SGLang environment at {venv_dir(base)}; run tests/real_sglang/setup.sh"
        )
    full_env = {**base, **shim_env(base)}
    argv = [str(python), "-m", "sglang.launch_server", *with_defaults(args, model_dir(base))]
    return argv, full_env


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    print_only = "--kvpilot-print" in args
    args = [a for a in args if a != "--kvpilot-print"]
    try:
        cmd, env = build_command(args)
        if not has_flag(args, "--model-path"):
            ensure_model(Path(cmd[0]), model_dir(env))
    except LaunchError as exc:
        print(f"launch.py: {exc}", file=sys.stderr)
        return 3
    if print_only:
        added = {k: v for k, v in shim_env(os.environ).items() if os.environ.get(k) != v}
        print(" ".join(f"{k}={shlex.quote(v)}" for k, v in added.items()), shlex.join(cmd))
        return 0
    os.execve(cmd[0], cmd, env)  # does not return
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
