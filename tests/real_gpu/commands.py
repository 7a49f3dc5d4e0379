"""The command lines and the configuration a GPU call runs, as data (standard library only, so
that `--dry-run` prints them anywhere)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

# Every server runs these: dummy (random) weights need no weights file, the triton attention and
# the pytorch sampling backends need no flashinfer (gpu-sglang.md, in the reference notes).
SGLANG_FLAGS = (
    "--load-format",
    "dummy",
    "--attention-backend",
    "triton",
    "--sampling-backend",
    "pytorch",
    "--enable-metrics",
)
PROFILE = "uniform"  # prompts U(400, 1000) tokens, outputs U(1000, 4000): sim/workload.py
# prompts U(5000, 7000), outputs U(500, 1000): within the model's 8,192 context, every request
# a long prefill, the pool full of long histories (the OOM probe's load)
LONG_PROFILE = "long-context"
LONGEST_S = 86_400  # the load runs until a phase stops it
SERVER = "gpu"  # the server's name in the experiment's kvpilot.toml


def sglang_command(
    python: str, model: Path, fraction: float, extra: Sequence[str] = ()
) -> list[str]:
    """`python -m sglang.launch_server` on the bundle's model at `fraction` (host and port are
    added where the server is started)."""
    return [
        python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model),
        *SGLANG_FLAGS,
        "--mem-fraction-static",
        f"{fraction:g}",
        *extra,
    ]


def load_command(
    python: str, url: str, clients: int, profile: str = PROFILE, options: Sequence[str] = ()
) -> list[str]:
    """The closed-loop clients: `python -m sim.load` until SIGTERM, with its timeline."""
    return [
        python,
        "-m",
        "sim.load",
        "--url",
        url,
        "--concurrency",
        str(clients),
        "--profile",
        profile,
        "--duration",
        str(LONGEST_S),
        "--json",
        "--timeline",
        *(arg for option in options for arg in ("--profile-option", option)),
    ]


def cli_command(python: str, config: Path | str, *args: str) -> list[str]:
    """One `kvpilot` command (`python -m bot.cli`) on the call's configuration."""
    return [python, "-m", "bot.cli", *args, "--config", str(config)]


def experiment_args(change: str, force: bool = False) -> list[str]:
    """`kvpilot experiment`: the change (KEY=VALUE), approved by the operator running the call
    (--yes); with --force, run although kvpilot's safety checks call it unsafe."""
    forced = ["--force"] if force else []
    return ["experiment", "--server", SERVER, "--set", change, "--yes", *forced, "--json"]


def kvpilot_config(
    url: str,
    command: Sequence[str],
    env: Mapping[str, str],
    gate: Mapping[str, float],
    *,
    local_gpus: bool,
    time_scale: float = 1.0,
    ready_timeout_s: float = 300.0,
) -> str:
    """kvpilot.toml for one server kvpilot launches itself (docs/launchers.md, `process`)."""
    lines = ["[kvpilot]", 'database = "kvpilot.db"', 'state_dir = "state"']
    if time_scale != 1.0:
        lines.append(f"time_scale = {time_scale:g}")
    lines += ["", "[gate]", *(f"{k} = {v:g}" for k, v in gate.items())]
    lines += [
        "",
        f"[servers.{SERVER}]",
        f"url = {json.dumps(url)}",
        'engine = "sglang"',
        f"local_gpus = {'true' if local_gpus else 'false'}",
        "local_host = true",
        "",
        f"[servers.{SERVER}.launcher]",
        'kind = "process"',
        f"ready_timeout_s = {ready_timeout_s:g}",
        "stop_timeout_s = 15",
        f"command = {json.dumps(list(command))}",
        "env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in sorted(env.items())) + " }",
    ]
    return "\n".join(lines) + "\n"
