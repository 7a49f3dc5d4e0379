"""`kvpilot doctor` with a server read through a real Prometheus: a selector that picks the
server's series passes, one that matches nothing is named with its fix."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.cli import main
from tests.playbooks.sources.prometheus.prom_process import PrometheusProcess, running_prometheus
from tests.twin_process import TwinProcess, running_twin

# Prometheus scrapes every 100 ms, which a busy machine's twin can miss: run on a quiet one.
pytestmark = pytest.mark.serial


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TwinProcess, Prometheus]]:
    with running_twin(["--time-scale", "100", "--enable-metrics"]) as twin:
        target = twin.url.removeprefix("http://")
        work = tmp_path_factory.mktemp("prometheus")
        with running_prometheus(work, [target], "100ms") as prom:
            prom.wait_for_series(f'sglang:num_running_reqs{{instance="{target}"}}')
            yield twin, prom


Prometheus = PrometheusProcess


def doctor(tmp_path: Path, twin: TwinProcess, prom: Prometheus, selector: str) -> tuple[int, str]:
    config = tmp_path / "kvpilot.toml"
    config.write_text(
        "[kvpilot]\ntime_scale = 100\n\n"  # the twin's
        f'[servers.kimi]\nurl = "{twin.url}"\n\n[servers.kimi.metrics]\nsource = "prometheus"\n'
        f"url = \"{prom.url}\"\nselector = '{selector}'\n"
    )
    out = io.StringIO()
    code = main(["doctor", "--config", str(config), "-o", "json"], out=out, err=io.StringIO())
    report = json.loads(out.getvalue())
    return code, "\n".join(f"{c['detail']} | {c['fix']}" for c in report["checks"])


@pytest.mark.parametrize(
    ("selector", "code", "says"),
    [
        ('{job="sglang"}', 0, "metrics: Prometheus at "),
        (
            '{job="vllm-prod"}',
            1,
            'metrics: Prometheus at .* has no SGLang series for {job="vllm-prod"}',
        ),
    ],
)
def test_the_selector_is_checked_against_what_prometheus_holds(
    tmp_path: Path,
    scraped: tuple[TwinProcess, Prometheus],
    monkeypatch: pytest.MonkeyPatch,
    selector: str,
    code: int,
    says: str,
) -> None:
    """One that picks the server's series passes; one that matches nothing is named with
    its fix (look the labels up in Prometheus)."""
    monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)
    twin, prom = scraped
    got, text = doctor(tmp_path, twin, prom, selector)
    assert got == code, text
    assert re.search(says, text), text
    if code:
        assert "the selector's labels match what Prometheus stores" in text.split(" | ")[-1]
