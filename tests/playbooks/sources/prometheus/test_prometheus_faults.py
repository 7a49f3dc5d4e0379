"""Prometheus failing while an experiment measures through it, for real: the real Prometheus
scraping the twin is stopped during the trial, while the server itself runs on.

The change cannot be measured: it is reverted with no verdict (`unmeasured`), the message
names Prometheus, and the server is back on its baseline; nothing reads as a dead server.
"""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import pytest

from bot.cli import exit_codes
from bot.cli import main as cli_main
from playbooks.experiments.outcome import Outcome
from tests.faults.bot_process import BotProcess
from tests.faults.checks import outcome_of
from tests.playbooks.sources.prometheus.prom_process import running_prometheus
from tests.playbooks.sources.prometheus.test_real_prometheus import (
    INTERVAL,
    write_experiment_config,
)
from tests.twin_process import free_port

pytestmark = [pytest.mark.serial, pytest.mark.slow]  # Prometheus scrapes every 100 ms


def cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return cli_main(list(args), out=out, err=err), out.getvalue(), err.getvalue()


def test_prometheus_down_in_the_trial_reverts_the_change_unmeasured(tmp_path: Path) -> None:
    port = free_port()
    with running_prometheus(tmp_path / "prometheus", [f"127.0.0.1:{port}"], INTERVAL) as prom:
        config = tmp_path / "kvpilot.toml"
        write_experiment_config(config, port, prom.url)
        code, _, err = cli("server", "start", "--server", "incident", "--config", str(config))
        assert code == 0, err
        try:
            prom.wait_for_series(f'sglang:num_running_reqs{{instance="127.0.0.1:{port}"}}')
            bot = BotProcess(config, "incident", "max_running_requests=36", "trial", tmp_path)
            try:
                bot.paused()
                prom.stop()  # Prometheus goes down; the server runs on
                bot.go_on()
                code, _ = bot.finish()
            finally:
                bot.kill()
            row, end = outcome_of(config.parent / "var" / "kvpilot.db")
            said = bot.stderr
            assert str(row.state) == "reverted", (row.state, said[-3000:])
            assert end.cause_code == "unmeasured" and end.outcome == Outcome.no_verdict, end
            assert f"Prometheus at {prom.url}" in end.cause, end.cause
            assert code == exit_codes.BY_OUTCOME[Outcome.no_verdict], said[-3000:]
            info = httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=10).json()
            assert info["max_running_requests"] == 24  # the baseline's, as launched
            assert "Traceback" not in said, said[-3000:]
        finally:
            cli("server", "stop", "--server", "incident", "--config", str(config))
