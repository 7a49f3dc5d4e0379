"""The `kvpilot` command line.

Every user error ends with one `error: ...` line that says what was wrong and how to fix it, and
exit status 2 (usage) or 1 (the server or environment); never a traceback.

Why it is long: the `kvpilot` command-line grammar (the subcommands' parsers and their
dispatch; only the rollout's parser lives apart) is kept in one place, so `--help`, completion
and the README's commands are checked against one parser.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, TextIO

from bot.app.front_ends import FRONT_ENDS, check_serves, front_end
from bot.chat.render import render
from bot.cli.claims import add_claims_parser, cmd_claims
from bot.cli.output import add_output, id_argument
from bot.cli.report import add_report_parser, cmd_report
from bot.cli.rollout_parser import add_rollout_parser
from playbooks.clock import at_scale
from playbooks.diagnose.measure import MeasurementError
from playbooks.diagnose.playbook import diagnose
from playbooks.engines import DEFAULT as DEFAULT_ENGINE
from playbooks.engines import NAMES as ENGINE_NAMES
from playbooks.engines import detect, engine_named
from playbooks.engines.base import ArgError, EngineError
from playbooks.engines.types import DiagnoseSettings, MeasurePlan
from playbooks.sources.gpu import NvmlGpuReader
from playbooks.sources.host import ConfiguredHost, HostReader, MeminfoReader
from playbooks.sources.model_config import LocalModelConfigs


class Progress:
    """A one-line progress bar on a terminal; silent elsewhere."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.active = stream.isatty()

    def __call__(self, elapsed: float, target: float, message: str) -> None:
        if not self.active:
            return
        width = 30
        done = min(width, int(width * elapsed / target)) if target > 0 else 0
        bar = "#" * done + "." * (width - done)
        self.stream.write(f"\rmeasuring [{bar}] {elapsed:5.0f}/{target:.0f} s  {message}   ")
        self.stream.flush()

    def finish(self) -> None:
        if self.active:
            self.stream.write("\n")
            self.stream.flush()


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvpilot", description="Tune LLM inference servers safely."
    )
    parser.add_argument("--version", action="version", version=f"kvpilot {installed_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in (
        _add_diagnose,
        _add_experiment,
        _add_experiments,
        add_tune_parser,
        _add_servers,
        _add_front_ends,
    ):
        add(sub)
    add_report_parser(sub)
    add_rollout_parser(sub)
    add_claims_parser(sub)
    doc = sub.add_parser(
        "doctor", help="check the configuration, database, Slack and servers; change nothing"
    )
    doc.add_argument("--config", default=None, help="kvpilot.toml")
    add_output(doc, "print one JSON object")
    comp = sub.add_parser(
        "completion",
        help="print a shell completion script: source <(kvpilot completion bash)",
    )
    comp.add_argument("shell", choices=("bash", "zsh"))
    files = sub.add_parser(
        "files",
        help="print a deployment file kvpilot ships, e.g. kvpilot files slack-manifest",
    )
    files.add_argument("name", choices=("slack-manifest", "systemd-unit", "systemd-env"))
    return parser


Commands = Any  # argparse's subparsers action: its type is private


# `kvpilot experiment VERB`: one noun with verbs; `experiment --server ...` (run) and
# `experiments VERB` are the earlier spellings and stay.
EXPERIMENT_VERBS = ("run", "list", "show", "abort", "approve", "reject")


def normalise(argv: list[str]) -> list[str]:
    """`experiment run ...` is `experiment ...`; `experiment list|show|...` is `experiments
    list|show|...`."""
    if len(argv) >= 2 and argv[0] == "experiment" and argv[1] in EXPERIMENT_VERBS:
        if argv[1] == "run":
            return ["experiment", *argv[2:]]
        return ["experiments", *argv[1:]]
    return argv


def _add_diagnose(sub: Commands) -> None:
    d = sub.add_parser("diagnose", help="measure a server, name its bottleneck, propose changes")
    target = d.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--server",
        metavar="NAME|URL",
        help="a server name from the configuration (its API key, engine, host facts and "
        "metrics source with it), or a base URL such as http://127.0.0.1:30000 for a server "
        "that is not configured (then the flags below give its facts)",
    )
    target.add_argument(
        "--group",
        metavar="NAME",
        help="every server of a group in the configuration, measured at the same time",
    )
    d.add_argument(
        "--config",
        default=None,
        help="with a server name or --group: kvpilot.toml (default: $KVPILOT_CONFIG or "
        "./kvpilot.toml)",
    )
    d.add_argument(
        "--engine",
        default=None,
        choices=ENGINE_NAMES,
        help="with --server: the engine serving it (default: whichever answers); with --group "
        "each server's comes from the configuration",
    )
    d.add_argument("--api-key", default=None, help="the server's --api-key, if it has one")
    d.add_argument(
        "--window",
        type=_positive,
        default=None,
        metavar="SECONDS",
        help="measure exactly this long (default: until the rate is known to "
        "--precision, between 3 and 15 minutes)",
    )
    d.add_argument(
        "--precision",
        type=_positive,
        default=0.05,
        help="relative half-width of the 95%% interval to reach (default 0.05)",
    )
    d.add_argument("--max-window", type=_positive, default=900.0, metavar="SECONDS")
    d.add_argument(
        "--consider",
        action="append",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="evaluate a change you have in mind (repeat for separate changes)",
    )
    add_output(d, "print one JSON object")
    _add_memory_sources(d)
    d.add_argument(
        "--time-scale",
        type=_positive,
        default=None,
        help="measure on a clock K times faster than the wall clock (only for an "
        "SGLang twin started with --time-scale K; with --group, the configuration's)",
    )


def _add_memory_sources(d: argparse.ArgumentParser) -> None:
    """Where diagnose reads GPU memory and host RAM from, when the server does not say."""
    d.add_argument(
        "--gpu-memory-gib",
        type=_positive,
        default=None,
        help="free GPU memory per GPU before the weights load (about nvidia-smi's "
        "total); needed for exact capacity predictions on SGLang < 0.5.23",
    )
    d.add_argument(
        "--local-gpus",
        action="store_true",
        help="read GPU memory with NVML (the bot runs on the server's GPU host)",
    )
    host = d.add_mutually_exclusive_group()
    host.add_argument(
        "--host-ram-gib",
        type=_positive,
        default=None,
        help="the GPU host's RAM, for hierarchical-cache sizing",
    )
    host.add_argument(
        "--local-host",
        action="store_true",
        help="read host RAM from /proc/meminfo (the bot runs on the GPU host)",
    )


def _add_experiment(sub: Commands) -> None:
    e = sub.add_parser(
        "experiment",
        help="experiment run (apply one change, measure it, keep it or revert it), list, show, "
        "abort, approve, reject",
        description="`kvpilot experiment run --server NAME --set KEY=VALUE` (or without `run`); "
        "`kvpilot experiment list|show ID|abort ID|approve ID|reject ID` read and act on the "
        "history, as `kvpilot experiments ...` does.",
    )
    e.add_argument(
        "--config", default=None, help="kvpilot.toml (default: $KVPILOT_CONFIG or ./kvpilot.toml)"
    )
    e.add_argument("--server", required=True, help="a server name from the configuration")
    e.add_argument(
        "--set",
        action="append",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="the SGLang server arguments to change",
    )
    e.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    e.add_argument(
        "--force", action="store_true", help="run a change that the safety checks call unsafe"
    )
    add_output(e, "print the finished experiment as JSON")


def add_tune_parser(sub: Commands) -> None:
    t = sub.add_parser(
        "tune",
        help="a campaign: diagnose, then one gated experiment after another until nothing "
        "useful is left",
        description="Diagnose the server, then run the most promising change as an experiment, "
        "assess again from its verdict's window, and go on until nothing useful is left, the "
        "plan's restarts are used, or (with --allow) a change is not kept.",
    )
    t.add_argument("--config", default=None, help="kvpilot.toml")
    t.add_argument("--server", required=True, help="a server name from the configuration")
    t.add_argument(
        "--max-experiments",
        type=int,
        default=3,
        metavar="N",
        help="restarts the campaign may use (default 3)",
    )
    t.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="KEY=RANGE",
        help="a bounded plan, approved once: KEY=LOW..HIGH or KEY=VALUE[,VALUE] (repeat per "
        "argument); lossy changes (fp8 KV) run only when allowed here",
    )
    t.add_argument("--yes", action="store_true", help="approve without asking")
    t.add_argument(
        "--force",
        action="store_true",
        help="also propose changes the safety checks call unsafe or a learned bound forbids",
    )
    add_output(t, "print the campaign as JSON")


def _add_experiments(sub: Commands) -> None:
    ex = sub.add_parser(
        "experiments", help="the earlier spelling of `experiment list|show|abort|approve|reject`"
    )
    ex_sub = ex.add_subparsers(dest="action", metavar="ACTION")
    ls = ex_sub.add_parser("list", help="recent experiments")
    ls.add_argument("--config", default=None)
    ls.add_argument("--server", default=None)
    add_output(ls)
    show = ex_sub.add_parser("show", help="one experiment with its transitions and audit trail")
    show.add_argument("id", type=id_argument)
    show.add_argument("--config", default=None)
    add_output(show)
    ab = ex_sub.add_parser(
        "abort", help="stop an experiment and put its server back on the last-known-good config"
    )
    ab.add_argument("id", type=id_argument, help="the experiment id (`kvpilot experiments list`)")
    ab.add_argument("--config", default=None)
    add_output(ab, "print the finished experiment as JSON")
    for verb, what in (
        ("approve", "approve a recorded proposal and run it as an experiment here"),
        ("reject", "reject a recorded proposal; nothing is changed"),
    ):
        d_ = ex_sub.add_parser(verb, help=what)
        d_.add_argument("id", type=id_argument, help="the proposal id (from its message)")
        d_.add_argument("--config", default=None)
        d_.add_argument("--yes", action="store_true", help="do not ask for confirmation")
        add_output(d_, "print the experiment as JSON")


def _add_servers(sub: Commands) -> None:
    r = sub.add_parser("resume", help="finish or revert experiments a crash left unfinished")
    r.add_argument("--config", default=None)
    srv = sub.add_parser("server", help="start, stop or inspect a server kvpilot launches")
    srv.add_argument("action", choices=["start", "stop", "status"])
    srv.add_argument("--server", required=True)
    srv.add_argument("--config", default=None)
    add_output(srv, "with status: print one JSON object")


def _add_front_ends(sub: Commands) -> None:
    """Each chat front end's command (`bot.app.front_ends`): `--config`, then its own flags."""
    for name in FRONT_ENDS:
        found = front_end(name)
        command = sub.add_parser(found.command, help=found.help)
        command.add_argument("--config", default=None)
        found.arguments(command)
        command.set_defaults(front_end=name)


def cmd_front_end(ns: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """A front end's command: kvpilot.toml read with `[kvpilot] chat`'s identity, then the
    front end's entry; configuration and storage errors are one clear line each."""
    from bot.app.config import ConfigError, load  # noqa: PLC0415 - keeps `diagnose` light
    from bot.cli.chat import CHAT_IDS  # noqa: PLC0415
    from storage.errors import StorageError  # noqa: PLC0415

    try:
        config = load(ns.config, ids=CHAT_IDS)
        check_serves(config, ns.front_end)
        return front_end(ns.front_end).run(config, ns, out, err)
    except (ConfigError, StorageError) as exc:
        err.write(f"error: {exc}\n")
        return 2


def _changes_some_engine_reads(items: Sequence[Sequence[str]]) -> tuple[Any, ...]:
    """Check `--consider` before the engine is known: each change must be one some engine
    reads (raises the default engine's ArgError otherwise); nothing is kept until detection."""
    for change in items:
        first: ArgError | None = None
        for name in ENGINE_NAMES:
            try:
                engine_named(name).parse_change(change)
                break
            except ArgError as exc:
                first = first or exc
        else:
            assert first is not None
            raise first
    return ()


def cmd_diagnose(ns: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if ns.group is not None:
        return cmd_diagnose_group(ns, out, err)
    if "://" not in ns.server:
        return cmd_diagnose_named(ns, out, err)
    if ns.config is not None:
        err.write(
            "error: --config is read with a server name or --group; with a URL give the "
            "server's facts as flags (--api-key, --gpu-memory-gib, ...)\n"
        )
        return 2
    engine = engine_named(ns.engine or DEFAULT_ENGINE)  # detected below unless --engine
    try:
        # each engine has its own arguments: without --engine a change any engine knows is
        # read again once the server's engine is detected (a vLLM-only `kv_offloading_size`
        # is no SGLang argument); one no engine knows is refused now, as the default's
        consider = (
            tuple(engine.parse_change(items) for items in ns.consider)
            if ns.engine
            else _changes_some_engine_reads(ns.consider)
        )
        plan = MeasurePlan(
            precision=ns.precision,
            max_window_s=max(ns.max_window, ns.window or 0),
            min_window_s=min(180.0, ns.max_window),
            fixed_window_s=ns.window,
        )
    except (ArgError, ValueError) as exc:
        err.write(f"error: {exc}\n")
        return 2
    host: HostReader | None = None
    if ns.host_ram_gib is not None:
        host = ConfiguredHost(ns.host_ram_gib)
    elif ns.local_host:
        host = MeminfoReader()
    settings = DiagnoseSettings(
        plan=plan,
        consider=consider,
        gpu_memory_gib=ns.gpu_memory_gib,
        gpus=NvmlGpuReader() if ns.local_gpus else None,
        host=host,
        models=LocalModelConfigs(),
    )
    progress = Progress(err)
    clock = at_scale(ns.time_scale or 1.0)
    try:
        client = engine.connect(ns.server, api_key=ns.api_key, clock=clock.now)  # the URL only
    except EngineError as exc:
        err.write(f"error: {exc}\n")
        return 2
    try:
        if ns.engine is None:  # whichever engine answers
            client.close()
            client = detect(ns.server, api_key=ns.api_key, clock=clock.now)
            try:
                consider = tuple(client.engine.parse_change(i) for i in ns.consider)
            except ArgError as exc:
                err.write(f"error: {exc} (for {client.engine.label} at {ns.server})\n")
                return 2
            settings = replace(settings, consider=consider)
        finding = diagnose(client, clock, settings, progress)
    except (EngineError, MeasurementError, ValueError) as exc:  # (a server info it cannot read)
        progress.finish()
        err.write(f"error: {exc}\n")
        return 1
    finally:
        client.close()
    progress.finish()
    return _print_finding(finding.to_json(), ns, out)


def configured_members(
    ns: argparse.Namespace, err: TextIO, what: str
) -> tuple[str, list[Any], Any] | int:
    """`diagnose` of configured servers (`--server NAME` or `--group NAME`): each server's
    client and settings from its [servers.NAME] table (API key, engine, host facts, metrics
    source, launch command), as the console and Slack read them. Returns (group name or "",
    members, clock), or the exit code after saying what was wrong."""
    from bot.app.config import ConfigError, load, warn_to  # noqa: PLC0415
    from bot.app.wiring import (  # noqa: PLC0415
        diagnose_settings,
        engine,
        engine_client,
        launch_args_of,
        make_clock,
    )
    from bot.cli.chat import CHAT_IDS  # noqa: PLC0415
    from playbooks.diagnose.fleet import Member  # noqa: PLC0415

    per_server = [
        flag
        for flag, given in [
            ("--api-key", ns.api_key is not None),
            ("--engine", ns.engine is not None),
            ("--gpu-memory-gib", ns.gpu_memory_gib is not None),
            ("--host-ram-gib", ns.host_ram_gib is not None),
            ("--local-host", ns.local_host),
            ("--local-gpus", ns.local_gpus),
        ]
        if given
    ]
    if per_server:
        err.write(
            f"error: {', '.join(per_server)} cannot be used with {what}: each server's "
            "settings come from its [servers.NAME] table in the configuration (give a URL "
            "instead of a name to diagnose with flags only)\n"
        )
        return 2
    try:
        plan = MeasurePlan(
            precision=ns.precision,
            max_window_s=max(ns.max_window, ns.window or 0),
            min_window_s=min(180.0, ns.max_window),
            fixed_window_s=ns.window,
        )
        config = load(ns.config, warn=warn_to(err), ids=CHAT_IDS)
        if ns.group is not None:
            group, servers = config.group_servers(ns.group)
            name = group.name
        else:
            servers, name = [config.server(ns.server)], ""
        clock = at_scale(ns.time_scale) if ns.time_scale else make_clock(config)
        members = [
            Member(
                s.name,
                engine_client(s, clock=clock, launch_args=launch_args_of(config, s, clock)),
                replace(
                    diagnose_settings(s),
                    plan=plan,
                    consider=tuple(engine(s).parse_change(items) for items in ns.consider),
                ),
            )
            for s in servers
        ]
    except (ArgError, ValueError, ConfigError, EngineError) as exc:
        err.write(f"error: {exc}\n")
        return 2
    return name, members, clock


def cmd_diagnose_named(ns: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """`diagnose --server NAME`: one configured server, read as the console reads it."""
    if ":" in ns.server or "/" in ns.server:  # host:port, not a name: the scheme is missing
        err.write(
            f"error: {ns.server!r} is neither a configured server's name nor a URL: give a name "
            "from kvpilot.toml, or a URL with its scheme such as http://HOST:PORT\n"
        )
        return 2
    built = configured_members(ns, err, "a server name")
    if isinstance(built, int):
        return built
    _, [member], clock = built
    progress = Progress(err)
    try:
        finding = diagnose(member.client, clock, member.settings, progress)
    except (EngineError, MeasurementError, ValueError) as exc:
        progress.finish()
        err.write(f"error: {ns.server}: {exc}\n")
        return 1
    finally:
        member.client.close()
    progress.finish()
    return _print_finding(finding.to_json(), ns, out)


def _print_finding(data: dict[str, Any], ns: argparse.Namespace, out: TextIO) -> int:
    if ns.json:
        out.write(json.dumps(data) + "\n")
    else:
        out.write(render("diagnose.txt.j2", f=data))
    return 0


def cmd_diagnose_group(ns: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """`diagnose --group NAME`: every server of the group at once, then the group side by side."""
    from playbooks.diagnose.fleet import diagnose_group  # noqa: PLC0415

    built = configured_members(ns, err, "--group")
    if isinstance(built, int):
        return built
    group_name, members, clock = built
    progress = Progress(err)
    latest: dict[str, float] = {}
    lock = threading.Lock()

    def report(name: str, elapsed: float, target: float, message: str) -> None:
        with lock:
            latest[name] = elapsed
            progress(min(latest.values()), target, f"{len(latest)}/{len(members)} servers")

    try:
        result = diagnose_group(group_name, members, clock, on_progress=report)
    finally:
        for m in members:
            m.client.close()
    progress.finish()
    if ns.json:
        out.write(json.dumps(result.to_json()) + "\n")
    else:
        for r in result.members:
            out.write(f"== {r.name} ({r.url}), metrics from {r.metrics_from}\n")
            if r.finding is None:
                out.write(f"error: {r.error}\n\n")
            else:
                out.write(render("diagnose.txt.j2", f=r.finding.to_json()) + "\n")
        out.write(render_group_summary(result.summary()))
    for r in result.failed:
        err.write(f"error: {r.name} could not be diagnosed: {r.error}\n")
    return 1 if result.failed else 0


def render_group_summary(s: dict[str, object]) -> str:
    rows = s["rows"]
    assert isinstance(rows, list)
    lines = [
        f"== group {s['group']}: {s['measured']} of {s['servers']} servers measured",
        f"{'server':16} {'bottleneck':10} {'decode tok/s':>12} {'usage':>6} {'running':>8} "
        f"{'queued':>7}  change to try",
    ]
    for r in rows:
        if r["error"] is not None:
            lines.append(f"{r['server']:16} not measured: {r['error']}")
            continue
        change = f"{r['top_change']} ({r['top_verdict']})" if r["top_change"] else "-"
        rate = r["generation_tokens_per_s"]
        usage = r["token_usage"]
        lines.append(
            f"{r['server']:16} {r['bottleneck']:10} "
            f"{'-' if rate is None else f'{rate:,.1f}':>12} "
            f"{'-' if usage is None else f'{usage:.2f}':>6} {r['running']:>8.1f} "
            f"{r['queued']:>7.1f}  {change}"
        )
    total = s["generation_tokens_per_s_total"]
    by = s["bottlenecks"]
    assert isinstance(by, dict)
    counts = ", ".join(f"{k} {len(v)}" for k, v in sorted(by.items())) or "none"
    lines.append(
        "total decode rate "
        + ("-" if total is None else f"{total:,.1f} tok/s")
        + f"; bottlenecks: {counts}"
    )
    return "\n".join(lines) + "\n"


def installed_version() -> str:
    """The installed distribution's version (pyproject.toml's), or "unknown" in a bare tree."""
    try:
        return str(importlib.metadata.version("kvpilot"))
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    try:
        return _main(argv, out, err)
    except BrokenPipeError:
        # The reader went away (`kvpilot experiments list | head`): stop quietly, as other
        # command-line tools do. Python would still flush stdout at exit and complain, so
        # stdout is pointed at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _main(argv: list[str] | None, out: TextIO, err: TextIO) -> int:
    parser = build_parser()
    ns = parser.parse_args(normalise(list(sys.argv[1:] if argv is None else argv)))
    if getattr(ns, "output", None) is not None:
        ns.json = ns.output == "json"
    if ns.command == "report":
        return cmd_report(ns, out, err)
    if ns.command == "diagnose":
        return cmd_diagnose(ns, out, err)
    if getattr(ns, "front_end", None) is not None:
        return cmd_front_end(ns, out, err)
    if ns.command == "rollout":
        from bot.cli.rollout import cmd_rollout  # noqa: PLC0415 - keeps `diagnose` light

        return cmd_rollout(ns, out, err, sys.stdin)
    if ns.command == "doctor":
        from bot.cli.doctor import doctor  # noqa: PLC0415 - Slack and engines load only here

        return doctor(ns.config, out, as_json=ns.json, env=dict(os.environ))
    if ns.command == "completion":
        from bot.cli.completion import completion  # noqa: PLC0415

        return completion(parser, ns.shell, out)
    if ns.command == "claims":
        return cmd_claims(ns, out, err)
    if ns.command == "files":
        from bot.cli.files import show  # noqa: PLC0415

        return show(ns.name, out, err)
    if ns.command in ("experiment", "experiments", "resume", "server", "tune"):
        from bot.cli import experiments as experiments_cli  # noqa: PLC0415 - keeps `diagnose` free of storage

        return experiments_cli.dispatch(ns, out, err, sys.stdin)
    parser.print_help(err)
    return 2
