"""The `experiment` phase (`experiment-clear` with its default change): kvpilot's own command
line and process launcher run one experiment on the real SGLang under load, exactly as an
operator would.

kvpilot starts the server at the starting fraction (`kvpilot server start`, with
`--start-extra`), 150 closed-loop clients fill it and stay on, then `kvpilot experiment --set
CHANGE --yes` (CHANGE: `--set`, else mem_fraction_static=TARGET, the queue-clearing raise)
measures a baseline, restarts the server with the change, measures the trial and keeps or
reverts it. `--yes` is the operator's approval, recorded as the OS account that ran it. The
phase keeps the verdict, the exit status, the stored experiment and the server's final arguments.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.real_gpu.call import Call, find_key
from tests.real_gpu.commands import SERVER, cli_command, experiment_args, kvpilot_config
from tests.real_gpu.load import Load
from tests.real_gpu.server import metrics_summary

REPO = Path(__file__).resolve().parents[2]
INTERRUPT_MARGIN_S = 25.0  # before the call's deadline: Ctrl-C to kvpilot, which reverts
KILL_MARGIN_S = 5.0


def run_cli(call: Call, config: Path, *args: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """One kvpilot command to its end: exit status, output (JSON where it printed JSON)."""
    m = call.machine
    result = subprocess.run(
        cli_command(m.python, config, *args),
        env=m.tool_env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    m.log_path("kvpilot-" + "-".join(args[:2])).write_text(
        f"$ kvpilot {' '.join(args)}\nexit {result.returncode}\n--- stdout\n{result.stdout}"
        f"\n--- stderr\n{result.stderr}"
    )
    return {"exit_status": result.returncode, "json": _json(result.stdout), "err": result.stderr}


def _json(text: str) -> Any:
    for line in reversed(text.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def in_flight(url: str) -> float:
    try:
        gauges = metrics_summary(httpx.get(url + "/metrics", timeout=10).text)["gauges"]
    except (httpx.HTTPError, ValueError):
        return 0.0
    return float(gauges.get("sglang:num_running_reqs", 0.0)) + float(
        gauges.get("sglang:num_queue_reqs", 0.0)
    )


def wait_full(call: Call, url: str, clients: int, timeout_s: float = 60.0) -> float:
    """Seconds until the clients' requests are all at the server (running or queued)."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        if in_flight(url) >= 0.9 * clients:
            break
        time.sleep(1.0)
    return round(time.monotonic() - began, 1)


def run_experiment(call: Call, config: Path, change: str, force: bool = False) -> dict[str, Any]:
    """`kvpilot experiment ... --yes --json`, its progress shown as it comes; interrupted (and
    so reverted by kvpilot) if it would outlast the call."""
    m = call.machine
    argv = cli_command(m.python, config, *experiment_args(change, force))
    log = m.log_path("kvpilot-experiment")
    out_path = log.with_suffix(".json")
    with out_path.open("w") as out:
        proc = subprocess.Popen(
            argv, env=m.tool_env, cwd=REPO, stdout=out, stderr=subprocess.PIPE, text=True
        )
    lines: list[str] = []

    def relay() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            call.say("  kvpilot: " + line.rstrip())

    reader = threading.Thread(target=relay, daemon=True)
    reader.start()
    interrupted = killed = False
    while proc.poll() is None:
        if not interrupted and call.left_s() < INTERRUPT_MARGIN_S:
            call.say("  the call's time is nearly out: Ctrl-C to kvpilot, which reverts")
            proc.send_signal(signal.SIGINT)
            interrupted = True
        if call.left_s() < KILL_MARGIN_S:
            proc.kill()
            killed = True
            break
        time.sleep(0.5)
    proc.wait()
    reader.join(timeout=5)
    if proc.stderr is not None:
        proc.stderr.close()
    log.write_text("".join(lines))
    return {
        "exit_status": proc.returncode,
        "interrupted": interrupted,
        "killed": killed,
        "summary": _json(out_path.read_text()),
    }


def write_config(call: Call, folder: Path, url: str) -> Path:
    """The call's kvpilot.toml: one server `gpu` that kvpilot's process launcher starts."""
    s, m = call.settings, call.machine
    command = [*m.server(s.fraction, s.start_extra), "--host", "127.0.0.1", "--port", str(s.port)]
    # what SGLang's environment has that kvpilot's tools' has not: the path without the repo
    env = {k: v for k, v in m.server_env.items() if m.tool_env.get(k) != v}
    config = folder / "kvpilot.toml"
    config.write_text(
        kvpilot_config(
            url,
            command,
            env,
            s.gate,
            local_gpus=m.local_gpus,
            time_scale=m.time_scale,
            ready_timeout_s=m.start_timeout_s * m.time_scale,  # on kvpilot's clock
        )
    )
    return config


def under_load(call: Call, config: Path, url: str, result: dict[str, Any]) -> None:
    """The clients on, the experiment run to its end, the clients off."""
    s = call.settings
    result["start_capacity"] = find_key(
        httpx.get(url + "/get_server_info", timeout=30).json(), "max_total_num_tokens"
    )
    call.say(f"{s.clients} clients on (prompts U(400,1000), outputs U(1000,4000))")
    load = Load.start(call.machine, url, s.clients, REPO)
    try:
        result["ramp_s"] = wait_full(call, url, s.clients)
        forced = " --force" if s.force else ""
        call.say(f"kvpilot experiment --set {s.experiment_change} --yes{forced}")
        ran = run_experiment(call, config, s.experiment_change, s.force)
    finally:
        report = load.stop()
        report.pop("finished", None)
        result["load"] = report
    summary = ran["summary"] or {}
    result.update(
        exit_status=ran["exit_status"],
        interrupted=ran["interrupted"],
        killed=ran["killed"],
        experiment=summary,
        state=summary.get("state"),
        outcome=summary.get("outcome"),
        rule=summary.get("rule"),
        reason=summary.get("reason"),
    )
    call.say(f"  exit {ran['exit_status']}: {summary.get('state')}, {summary.get('reason')}")


def record_after(call: Call, config: Path, url: str, result: dict[str, Any]) -> None:
    """The stored experiment, its approval, and the arguments the server ended on."""
    s = call.settings
    if isinstance(result.get("experiment"), dict) and "id" in result["experiment"]:
        shown = run_cli(
            call, config, "experiments", "show", str(result["experiment"]["id"]), "--json"
        )
        result["stored"] = shown["json"]
        moves = (shown["json"] or {}).get("transitions") or []
        # the person's approval: `--yes` recorded as the OS account that ran the command
        result["approval"] = next((t for t in moves if t.get("to") == "approved"), None)
    status = run_cli(call, config, "server", "status", "--server", SERVER, "--json")
    result["final_args"] = (status["json"] or {}).get("args")
    try:
        info = httpx.get(url + "/get_server_info", timeout=30).json()
        result["final_fraction"] = find_key(info, "mem_fraction_static")
        result["final_capacity"] = find_key(info, "max_total_num_tokens")
        key = s.experiment_change.partition("=")[0].strip().replace("-", "_")
        result["final_value"] = {key: find_key(info, key)}
    except (httpx.HTTPError, ValueError) as exc:
        result["final_error"] = f"{type(exc).__name__}: {exc}"


def experiment_clear(call: Call) -> dict[str, Any]:
    """The phase under its first name: the fraction raised to --target."""
    return experiment(call, "experiment-clear")


def experiment(call: Call, phase: str = "experiment") -> dict[str, Any]:
    s, m = call.settings, call.machine
    folder = call.work / "experiment"
    folder.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{s.port}"
    config = write_config(call, folder, url)
    start = " ".join([f"mem_fraction_static={s.fraction:g}", *s.start_extra])
    change = f"{start} -> {s.experiment_change}"
    result: dict[str, Any] = {"phase": phase, "change": change, "status": "failed"}
    result["config"] = config.read_text()
    call.say(f"kvpilot server start ({start})")
    began = time.monotonic()
    started = run_cli(
        call, config, "server", "start", "--server", SERVER, timeout_s=m.start_timeout_s + 60
    )
    result["server_start"] = {
        "exit_status": started["exit_status"],
        "seconds": round(time.monotonic() - began, 1),
    }
    try:
        if started["exit_status"] != 0:
            result["error"] = "kvpilot could not start the server: " + started["err"][-3000:]
            return result
        under_load(call, config, url, result)
        record_after(call, config, url, result)
    finally:  # whatever happened, kvpilot stops the server it started
        run_cli(call, config, "server", "stop", "--server", SERVER)
        for log in sorted((folder / "state").glob("*.log")):
            m.log_path(f"launcher-{log.stem}").write_text(log.read_text(errors="replace"))
        if (folder / "kvpilot.db").exists():  # every scrape of the experiment, for fixtures
            shutil.copyfile(folder / "kvpilot.db", m.log_path("kvpilot-db").with_suffix(".db"))
        m.wait_gpu_idle()
    result["status"] = "ok" if result.get("state") and not result.get("killed") else "failed"
    return result
