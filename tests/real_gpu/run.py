"""`make test-gpu`: the real SGLang 0.5.17 on a GPU machine, in phases chosen by name.

    python3 -m tests.real_gpu.run --phases smoke,capacity,experiment-clear
    python3 -m tests.real_gpu.run --phases experiment --fraction 0.82 --set max_running_requests=48
    python3 -m tests.real_gpu.run --phases oom-probe --probe-fractions 0.93,0.95,0.97
    python3 -m tests.real_gpu.run --phases ab --ab-side a --ab-fractions 0.40,0.85
    python3 -m tests.real_gpu.run --phases smoke --dry-run     # what it would run, anywhere
    python3 -m tests.real_gpu.run --detach --phases ab ... --ab-steady-s 600   # longer than a call
    python3 -m tests.real_gpu.run --attach --phases ab ... --ab-steady-s 600   # the next call

Runs with the GPU image's own python3 (3.12, torch 2.11) in the repository's root, with the
bundle carried in `.gpu/` (`make gpu-bundle`). It unpacks the bundle into /tmp/kvpilot-gpu (once
per archive: a machine kept warm reuses it), checks the machine first (python, torch, the GPU,
libnvrtc, the port), plans the phases within --budget-s, and writes one JSON per phase, run.json,
results.txt, logs.tar.xz and the compile caches (jit-cache.tar.xz: put it in `.gpu/` so that the
next call skips compiling) into $OUT, else ./gpu-results. docs/gpu.md says what each phase does.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from sim.workload import PROFILES
from tests.real_gpu import commands as cmd
from tests.real_gpu import detach
from tests.real_gpu import env as genv
from tests.real_gpu.plan import (
    AB_SIDES,
    EXPERIMENTS,
    GATE_DEFAULTS,
    PHASES,
    Settings,
    describe,
    make_plan,
)

REPO = Path(__file__).resolve().parents[2]
WORK = Path("/tmp/kvpilot-gpu")
EXIT_FAILED, EXIT_USAGE, EXIT_ENVIRONMENT = 1, 2, 3


def _fractions(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected fractions like 0.40,0.85, got {text!r}"
        ) from None


def _gate(text: str) -> dict[str, float]:
    gate = dict(GATE_DEFAULTS)
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = item.partition("=")
        if not eq or key not in GATE_DEFAULTS:
            raise argparse.ArgumentTypeError(
                f"--gate takes KEY=SECONDS pairs of {', '.join(GATE_DEFAULTS)}; got {item!r}"
            )
        try:
            gate[key] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--gate {key}: not a number: {value!r}") from None
    return gate


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m tests.real_gpu.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--phases", required=True, help=f"comma-separated: {', '.join(PHASES)}")
    p.add_argument(
        "--out", type=Path, default=None, help="results folder ($OUT, else ./gpu-results)"
    )
    p.add_argument("--bundle", type=Path, default=REPO / ".gpu" / genv.BUNDLE_NAME)
    p.add_argument("--work", type=Path, default=WORK, help="where the bundle is unpacked")
    p.add_argument("--budget-s", type=float, default=585.0, help="seconds this call may take")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--dry-run", action="store_true", help="print the plan and commands, run none")
    longer = p.add_mutually_exclusive_group()
    longer.add_argument(
        "--detach",
        action="store_true",
        help="run in a session of its own that outlives this call (tests/real_gpu/detach.py)",
    )
    longer.add_argument(
        "--attach",
        action="store_true",
        help="follow the detached run on; its files come back when it ends",
    )
    p.add_argument(
        "--detached-budget-s",
        type=float,
        default=1500.0,
        help="with --detach: the detached run's own budget (it spans calls)",
    )
    p.add_argument(
        "--fraction", type=float, default=0.40, help="smoke's and the experiment's start"
    )
    p.add_argument("--capacity-fractions", type=_fractions, default=(0.40, 0.60, 0.85))
    p.add_argument("--target", type=float, default=0.82, help="the experiment's fraction")
    p.add_argument("--clients", type=int, default=150, help="closed-loop clients under load")
    p.add_argument(
        "--gate",
        type=_gate,
        default=dict(GATE_DEFAULTS),
        metavar="KEY=S,...",
        help="the experiment's gate ("
        + ", ".join(f"{k}={v:g}" for k, v in GATE_DEFAULTS.items())
        + ")",
    )
    p.add_argument(
        "--set",
        dest="change",
        default=None,
        metavar="KEY=VALUE",
        help="the experiment phase's change (default mem_fraction_static=--target)",
    )
    p.add_argument(
        "--start-extra", default="", help="more SGLang flags for the experiment's first server"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="the experiment runs its change although kvpilot calls it unsafe (kvpilot's --force)",
    )
    p.add_argument(
        "--probe-fractions",
        type=_fractions,
        default=(0.93, 0.95, 0.97),
        help="the oom-probe phase's fractions",
    )
    p.add_argument("--probe-s", type=float, default=100.0, help="each probe's load, seconds")
    p.add_argument("--probe-clients", type=int, default=200)
    p.add_argument("--ab-fractions", type=_fractions, default=(0.40, 0.85), metavar="A,B")
    p.add_argument("--ab-extra-a", default="", help="more SGLang flags for side A")
    p.add_argument("--ab-extra-b", default="", help="more SGLang flags for side B")
    p.add_argument("--ab-side", choices=AB_SIDES, default="both")
    p.add_argument("--ab-warmup-s", type=float, default=60.0)
    p.add_argument("--ab-steady-s", type=float, default=300.0)
    p.add_argument(
        "--ab-profile",
        choices=sorted(PROFILES),
        default="uniform",
        help="the load of both sides (sim/workload.py)",
    )
    p.add_argument(
        "--ab-profile-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one of the profile's numbers, e.g. working_set_tokens=200000 (repeatable)",
    )
    return p


def settings_of(ns: argparse.Namespace) -> Settings:
    if len(ns.ab_fractions) != 2:
        raise ValueError("--ab-fractions takes two fractions, A,B")
    return Settings(
        phases=tuple(p.strip() for p in ns.phases.split(",") if p.strip()),
        fraction=ns.fraction,
        capacity_fractions=ns.capacity_fractions,
        target=ns.target,
        clients=ns.clients,
        gate=ns.gate,
        ab_fractions=(ns.ab_fractions[0], ns.ab_fractions[1]),
        ab_extra=(tuple(ns.ab_extra_a.split()), tuple(ns.ab_extra_b.split())),
        ab_side=ns.ab_side,
        ab_warmup_s=ns.ab_warmup_s,
        ab_steady_s=ns.ab_steady_s,
        ab_profile=ns.ab_profile,
        ab_profile_options=tuple(ns.ab_profile_option),
        change=ns.change,
        start_extra=tuple(ns.start_extra.split()),
        force=ns.force,
        probe_fractions=ns.probe_fractions,
        probe_s=ns.probe_s,
        probe_clients=ns.probe_clients,
        budget_s=ns.budget_s,
        port=ns.port,
    )


def out_dir(given: Path | None, environ: dict[str, str]) -> Path:
    if given is not None:
        return given
    return Path(environ["OUT"]) if environ.get("OUT") else REPO / "gpu-results"


class Progress:
    """Timestamped lines on stdout at once, and the same in the call's own log."""

    def __init__(self, log: Path | None = None) -> None:
        self.began = time.monotonic()
        self.log = log

    def __call__(self, message: str) -> None:
        line = f"[+{time.monotonic() - self.began:6.1f}s {time.strftime('%H:%M:%S')}] {message}"
        print(line, flush=True)
        if self.log is not None:
            with self.log.open("a") as f:
                f.write(line + "\n")


# -------------------------------------------------------------------------------- dry run


def dry_run(s: Settings, bundle: Path, work: Path, out: Path, say: Callable[[str], None]) -> int:
    """The plan, the environment and every command line, without a GPU or the bundle."""
    cache = work / "cache"
    jit = genv.has_files(cache) or (bundle.parent / genv.CACHE_NAME).is_file()
    plan = make_plan(s, jit_cached=jit, unpacked=False)
    say(f"dry run: results would go to {out}")
    for line in describe(plan, s):
        say(line)
    site = work / "bundle-<sha256 of the archive>" / "site"
    model = site.parent / "model"
    base = {"PATH": os.environ.get("PATH", "")}
    server_env = genv.runtime_env(
        base, site=site, cache=cache, nvrtc_dir=Path("<nvrtc>"), nvcc=None
    )
    shown = {k: server_env[k] for k in sorted(server_env) if k != "PATH"}
    say("SGLang's environment: " + " ".join(f"{k}={v}" for k, v in shown.items()))
    for command in planned_commands(s, "python3", model):
        say("would run: " + " ".join(command))
    if any(p in s.phases for p in EXPERIMENTS):
        url = f"http://127.0.0.1:{s.port}"
        server = [
            *cmd.sglang_command("python3", model, s.fraction, s.start_extra),
            "--host",
            "127.0.0.1",
        ]
        toml = cmd.kvpilot_config(
            url,
            [*server, "--port", str(s.port)],
            {"PYTHONPATH": str(site)},
            s.gate,
            local_gpus=True,
        )
        say("the experiment's kvpilot.toml:\n" + toml.rstrip())
    return 0


def planned_commands(s: Settings, python: str, model: Path) -> list[list[str]]:
    """Every command line the planned phases start (servers with --host/--port)."""
    url = f"http://127.0.0.1:{s.port}"
    config = "<call>/experiment/kvpilot.toml"

    def server(f: float, extra: Sequence[str] = ()) -> list[str]:
        host = ["--host", "127.0.0.1", "--port", str(s.port)]
        return [*cmd.sglang_command(python, model, f, extra), *host]

    out: list[list[str]] = []
    if "smoke" in s.phases:
        out.append(server(s.fraction))
    if "capacity" in s.phases:
        out.extend(server(f) for f in s.capacity_starts("smoke" in s.phases))
    if any(p in s.phases for p in EXPERIMENTS):
        out.append(cmd.cli_command(python, config, "server", "start", "--server", cmd.SERVER))
        out.append(cmd.load_command(python, url, s.clients))
        out.append(
            cmd.cli_command(python, config, *cmd.experiment_args(s.experiment_change, s.force))
        )
    if "oom-probe" in s.phases:
        for f in dict.fromkeys(s.probe_fractions):
            out.append(server(f))
            out.append(cmd.load_command(python, url, s.probe_clients, cmd.LONG_PROFILE))
    if "ab" in s.phases:
        for side in s.ab_runs:
            i = 0 if side == "a" else 1
            out.append(server(s.ab_fractions[i], s.ab_extra[i]))
            out.append(cmd.load_command(python, url, s.clients, s.ab_profile, s.ab_profile_options))
    return out


# ---------------------------------------------------------------------------- the real call


def preflight(ns: argparse.Namespace, say: Callable[[str], None]) -> list[genv.Check]:
    """What can be checked before unpacking anything."""
    try:
        torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch = None
    checks = [
        genv.check_python(genv.python_version()),
        genv.check_torch(torch),
        genv.check_bundle(ns.bundle),
        genv.check_port(ns.port),
        genv.check_disk(ns.work),
    ]
    for c in checks:
        say(c.line())
    return checks


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        s = settings_of(ns)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    out = out_dir(ns.out, dict(os.environ))
    say = Progress()
    if ns.dry_run:
        return dry_run(s, ns.bundle, ns.work, out, say)
    deadline = time.monotonic() + s.budget_s
    if ns.attach:  # before anything that would stop the detached run's server
        return attached(ns.work / "detached", deadline, out, say)
    stopped = genv.stop_leftovers(ns.work)
    if stopped:
        say(f"stopped the server(s) an earlier call left running: pid {stopped}")
    if any(not c.ok and c.fatal for c in preflight(ns, say)):
        say("stopping: fix the errors above (nothing was started)")
        return EXIT_ENVIRONMENT
    if ns.detach:
        return detached(argv if argv is not None else sys.argv[1:], ns, deadline, out, say)
    from tests.real_gpu.runner import prepare  # noqa: PLC0415 - after the checks

    return prepare(ns, s, out, say, deadline, REPO)


def detached(
    argv: Sequence[str],
    ns: argparse.Namespace,
    deadline: float,
    out: Path,
    say: Callable[[str], None],
) -> int:
    """Start the run in a session of its own and follow it for this call's budget."""
    run_dir = ns.work / "detached"
    command = [
        sys.executable,
        "-m",
        "tests.real_gpu.run",
        *detach.child_argv(argv, run_dir / "out", ns.detached_budget_s),
    ]
    pid = detach.start(command, run_dir, REPO).pid
    say(f"detached run started (pid {pid}, budget {ns.detached_budget_s:g} s): {run_dir}")
    return attached(run_dir, deadline, out, say)


def attached(run_dir: Path, deadline: float, out: Path, say: Callable[[str], None]) -> int:
    """Follow the detached run from where the last call left it, until it ends or the budget."""
    if not (run_dir / detach.LOG).exists():
        say(f"no detached run in {run_dir}: start one with --detach")
        return EXIT_USAGE
    mark = run_dir / "detached.offset"
    offset = int(mark.read_text()) if mark.exists() else 0
    status, offset = detach.follow(run_dir, deadline, print, offset)
    mark.write_text(str(offset))
    return detach.finish(run_dir, status, out, say)


if __name__ == "__main__":
    raise SystemExit(main())
