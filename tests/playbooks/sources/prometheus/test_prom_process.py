"""Without Prometheus installed its tests skip with the install command, unless CI requires it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.playbooks.sources.prometheus import prom_process


def test_missing_binary_skips_or_fails_when_required(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("shutil.which", lambda _name: None)
    monkeypatch.setattr(prom_process, "DEBIAN_PATH", tmp_path / "no-prometheus")
    monkeypatch.delenv("KVPILOT_REQUIRE_PROMETHEUS", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y"):
        prom_process.prometheus_binary()
    monkeypatch.setenv("KVPILOT_REQUIRE_PROMETHEUS", "1")
    with pytest.raises(pytest.fail.Exception, match="KVPILOT_REQUIRE_PROMETHEUS=1 but no"):
        prom_process.prometheus_binary()


def test_generated_configuration(tmp_path: Path) -> None:
    path = tmp_path / "prometheus.yml"
    prom_process.write_config(path, ["127.0.0.1:1", "127.0.0.1:2"], "50ms")
    text = path.read_text()
    assert "scrape_interval: 50ms" in text and "scrape_timeout: 50ms" in text
    assert 'targets: ["127.0.0.1:1", "127.0.0.1:2"]' in text
