"""Prometheus failing while an experiment measures through it, for real: the real Prometheus
scraping the twin is stopped during the trial, or its scrapes of the twin fail (a proxy between
them answers `/metrics` 500) so that its series go stale, while the server itself runs on.

The change cannot be measured: it is reverted with no verdict (`unmeasured`), the message
names Prometheus, and the server is back on its baseline; nothing reads as a dead server.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from bot.cli import exit_codes
from bot.cli import main as cli_main
from playbooks.experiments.outcome import Outcome
from tests.faults.bot_process import BotProcess
from tests.faults.checks import outcome_of
from tests.faults.proxy import FaultProxy
from tests.playbooks.sources.prometheus.prom_process import running_prometheus
from tests.playbooks.sources.prometheus.test_real_prometheus import (
    INTERVAL,
    SCALE,
    write_experiment_config,
)
from tests.ports import free_port

pytestmark = [pytest.mark.serial, pytest.mark.slow]  # Prometheus scrapes every 100 ms


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return cli_main(list(args), out=out, err=err), out.getvalue(), err.getvalue()


def broken_in_the_trial(
    config: Path, port: int, tmp_path: Path, prometheus_url: str, fault: Callable[[], None]
) -> str:
    """`kvpilot experiment` paused before the trial, `fault` made, the bot let go: the change
    must be reverted as unmeasured, naming Prometheus, the server back on the baseline.
    Returns why it ended."""
    bot = BotProcess(config, "incident", "max_running_requests=36", "trial", tmp_path)
    try:
        bot.paused()
        fault()
        bot.go_on()
        code, _ = bot.finish()
    finally:
        bot.kill()
    row, end = outcome_of(config.parent / "var" / "kvpilot.db")
    said = bot.stderr
    assert str(row.state) == "reverted", (row.state, said[-3000:])
    assert end.cause_code == "unmeasured" and end.outcome == Outcome.no_verdict, end
    assert f"Prometheus at {prometheus_url}" in end.cause, end.cause
    assert code == exit_codes.BY_OUTCOME[Outcome.no_verdict], said[-3000:]
    info = httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=10).json()
    assert info["max_running_requests"] == 24  # the baseline's, as launched
    assert "Traceback" not in said, said[-3000:]
    return end.cause


def test_prometheus_down_in_the_trial_reverts_the_change_unmeasured(tmp_path: Path) -> None:
    port = free_port()
    with running_prometheus(tmp_path / "prometheus", [f"127.0.0.1:{port}"], INTERVAL) as prom:
        config = tmp_path / "kvpilot.toml"
        write_experiment_config(config, port, prom.url)
        code, _, err = cli("server", "start", "--server", "incident", "--config", str(config))
        assert code == 0, err
        try:
            prom.wait_for_series(f'sglang:num_running_reqs{{instance="127.0.0.1:{port}"}}')
            # Prometheus goes down; the server runs on
            broken_in_the_trial(config, port, tmp_path, prom.url, prom.stop)
        finally:
            cli("server", "stop", "--server", "incident", "--config", str(config))


def write_proxied_config(path: Path, port: int, proxy_port: int, prometheus_url: str) -> None:
    """The twin behind the process launcher, its metrics read from Prometheus, which scrapes it
    through the proxy (so its series carry the proxy's address), at most 1 s old: 100
    simulated seconds at this scale, less than the gap the gate bridges."""
    command = [
        *(sys.executable, "-m", "sim.launch_server", "--port", str(port)),
        *("--max-running-requests", "24", "--enable-metrics", "--time-scale", str(SCALE)),
        *("--workload", "incident", "--concurrency", "48"),
    ]
    selector = f'{{instance="127.0.0.1:{proxy_port}"}}'
    path.write_text(
        f"[kvpilot]\ntime_scale = {SCALE}\n\n"
        "[gate]\nscrape_s = 10\nbatch_s = 60\nbaseline_s = 360\n\n"
        f'[servers.incident]\nurl = "http://127.0.0.1:{port}"\n'
        f'metrics = {{ source = "prometheus", url = "{prometheus_url}", '
        f"selector = '{selector}', max_age_s = 1 }}\n"
        f'[servers.incident.launcher]\nkind = "process"\ncommand = {json.dumps(command)}\n'
    )


def test_prometheus_series_gone_stale_in_the_trial_revert_the_change_unmeasured(
    tmp_path: Path,
) -> None:
    port = free_port()
    with FaultProxy(f"http://127.0.0.1:{port}") as proxy:
        proxy_port = int(proxy.url.rsplit(":", 1)[1])
        target = [f"127.0.0.1:{proxy_port}"]
        with running_prometheus(tmp_path / "prometheus", target, INTERVAL) as prom:
            config = tmp_path / "kvpilot.toml"
            write_proxied_config(config, port, proxy_port, prom.url)
            code, _, err = cli("server", "start", "--server", "incident", "--config", str(config))
            assert code == 0, err
            try:
                prom.wait_for_series(f'sglang:num_running_reqs{{instance="{target[0]}"}}')
                # Prometheus' scrapes of the twin fail: its series go stale
                cause = broken_in_the_trial(
                    config, port, tmp_path, prom.url, lambda: proxy.fail("/metrics")
                )
                assert "old" in cause, cause
            finally:
                cli("server", "stop", "--server", "incident", "--config", str(config))


def test_prometheus_scraping_another_target_changes_nothing(tmp_path: Path) -> None:
    """Prometheus scrapes some other address, so no series matches the server's selector:
    the experiment is refused before anything is restarted, naming the query to fix."""
    port, elsewhere = free_port(), free_port()
    with running_prometheus(tmp_path / "prometheus", [f"127.0.0.1:{elsewhere}"], INTERVAL) as prom:
        config = tmp_path / "kvpilot.toml"
        write_experiment_config(config, port, prom.url)
        code, _, err = cli("server", "start", "--server", "incident", "--config", str(config))
        assert code == 0, err
        try:
            state = config.parent / "var" / "state" / "incident.process.json"
            pid = json.loads(state.read_text())["pid"]
            code, out, err = cli(
                "experiment", "--server", "incident", "--set", "max_running_requests=36",
                "--yes", "--config", str(config),
            )  # fmt: skip
            assert code != 0, (out, err)
            assert f'instance="127.0.0.1:{port}"' in err and "Prometheus" in err, err
            assert "Traceback" not in err, err
            after = httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=10).json()
            assert after["max_running_requests"] == 24
            assert json.loads(state.read_text())["pid"] == pid  # not restarted
        finally:
            cli("server", "stop", "--server", "incident", "--config", str(config))
