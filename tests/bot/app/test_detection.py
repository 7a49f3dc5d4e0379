"""Engine detection is kept per URL (`bot/app/detection.py`): a server that does not answer
costs one attempt per `FAILED_TTL_S`, not one per report; an engine found is kept. The clock is
the test's; nothing sleeps."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from bot.app import detection, wiring
from bot.app.config import load
from playbooks.engines import default_engine, detect, engine_named
from playbooks.engines.base import EngineClient


class Clock:
    def __init__(self) -> None:
        self.at = 1000.0

    def __call__(self) -> float:
        return self.at


def closed_port() -> int:
    """A loopback port nothing listens on: a connection there is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


class Counting:
    """The real detection, counted."""

    def __init__(self) -> None:
        self.urls: list[str] = []

    def __call__(self, url: str, **kw: Any) -> EngineClient:
        self.urls.append(url)
        return detect(url, **kw)


def test_an_unreachable_server_is_asked_once_a_minute_not_once_a_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    path = tmp_path / "kvpilot.toml"
    path.write_text(f'[servers.down]\nurl = "{url}"\n')
    config = load(str(path))
    clock, probe = Clock(), Counting()
    monkeypatch.setattr(detection, "DETECTIONS", detection.Detections(probe, now=clock))
    for _ in range(5):  # five reports over it, as `kvpilot report` asks for its engine
        assert wiring.engine_of(config, "down") is default_engine()
        clock.at += 10
    assert probe.urls == [url]
    clock.at += detection.FAILED_TTL_S  # the failure has expired: asked again
    assert wiring.engine_of(config, "down") is default_engine()
    assert wiring.engine_of(load(str(path)), "down") is default_engine()  # per URL, not config
    assert probe.urls == [url, url]


class Found:
    engine = engine_named("vllm")

    def close(self) -> None:
        pass


def test_an_engine_found_is_kept_for_the_process() -> None:
    clock, asked = Clock(), []

    def probe(url: str, **_: Any) -> Found:
        asked.append(url)
        return Found()

    found = detection.Detections(probe, now=clock)  # type: ignore[arg-type]
    assert found.engine("http://gpu-7:8000/") is Found.engine
    clock.at += 24 * 3600.0
    assert found.engine("http://gpu-7:8000") is Found.engine  # the same URL, no slash
    assert asked == ["http://gpu-7:8000/"]
