"""`metrics = { source = "prometheus", ... }` per server: validated, then wired to the client."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.app.config import ConfigError, load
from bot.app.wiring import diagnose_settings, engine_client, gpu_reader
from playbooks.sources.metrics_source import SourcedClient, describe_source
from playbooks.sources.prometheus import DcgmGpuReader

BASE = """
[servers.incident]
url = "http://10.0.0.5:30000"
"""


def load_with(tmp_path: Path, metrics: str) -> object:
    path = tmp_path / "kvpilot.toml"
    path.write_text(BASE + metrics)
    return load(str(path))


def test_direct_is_the_default(tmp_path: Path) -> None:
    path = tmp_path / "kvpilot.toml"
    path.write_text(BASE)
    server = load(str(path)).server("incident")
    assert server.metrics.source == "direct"
    client = engine_client(server)
    assert not isinstance(client, SourcedClient) and "scraped directly" in describe_source(client)
    assert gpu_reader(server) is None


def test_prometheus_with_default_and_explicit_selectors(tmp_path: Path) -> None:
    path = tmp_path / "kvpilot.toml"
    path.write_text(BASE + 'metrics = { source = "prometheus", url = "http://prom:9090/" }\n')
    server = load(str(path)).server("incident")
    assert server.metrics.url == "http://prom:9090"
    assert server.metrics.selector == '{instance="10.0.0.5:30000"}'
    assert server.metrics.max_age_s == 30.0
    client = engine_client(server)
    assert isinstance(client, SourcedClient)
    assert describe_source(client) == (
        'Prometheus at http://prom:9090, series {instance="10.0.0.5:30000"}'
    )
    path.write_text(
        BASE
        + "[servers.incident.metrics]\n"
        + 'source = "prometheus"\nurl = "http://prom:9090"\n'
        + 'selector = \'{job="sglang", pod="kimi-0"}\'\n'
        + "dcgm_selector = '{Hostname=\"gpu-7\"}'\nmax_age_s = 90\n"
    )
    server = load(str(path)).server("incident")
    assert server.metrics.selector == '{job="sglang", pod="kimi-0"}'
    assert server.metrics.max_age_s == 90.0
    assert isinstance(gpu_reader(server), DcgmGpuReader)
    assert isinstance(diagnose_settings(server).gpus, DcgmGpuReader)


@pytest.mark.parametrize(
    ("metrics", "message"),
    [
        ('metrics = "prometheus"\n', r"servers.incident.metrics: expected a table, e.g. "),
        ('metrics = { source = "graphite" }\n', "'graphite' is not known; use \"direct\" or"),
        ('metrics = { source = "prometheus" }\n', r"metrics.url: expected Prometheus' address"),
        ('metrics = { source = "prometheus", url = "prom:9090" }\n', "expected Prometheus'"),
        ('metrics = { url = "http://prom:9090" }\n', 'url only apply with source = "prometheus"'),
        (
            'metrics = { source = "prometheus", url = "http://p:9090", selector = \'x\' }\n',
            r"metrics.selector: selector 'x' must be label matchers in braces",
        ),
        (
            'metrics = { source = "prometheus", url = "http://p:9090", selector = \'{}\' }\n',
            "is empty: it would match every server",
        ),
        (
            'metrics = { source = "prometheus", url = "http://p:9090", '
            "dcgm_selector = '{a=b}' }\n",
            "metrics.dcgm_selector: selector '{a=b}': cannot read a label matcher",
        ),
        (
            'metrics = { source = "prometheus", url = "http://p:9090", max_age_s = -1 }\n',
            "metrics.max_age_s: must be positive",
        ),
        (
            'metrics = { source = "prometheus", url = "http://p:9090", step = 5 }\n',
            r"unknown key\(s\) step; allowed: dcgm_selector, max_age_s, selector, source, url",
        ),
    ],
)
def test_mistakes_are_named(tmp_path: Path, metrics: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_with(tmp_path, metrics)
