"""`status` at fleet size: no server asked live past `LIVE_STATUS_MAX`, the sampler's view summed
in a few lines that name only the servers needing a look."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlite_utils import Database

from bot.app.config import Config, parse
from bot.chat.views import LIVE_STATUS_MAX, status_message
from bot.reports.sampler import Sampler
from bot.reports.sampler_state import SERVER_LINES, ServerState, server_lines
from storage.metric_buckets import RawSample
from storage.metric_samples import Gap
from tests.bot.reports.fake_sglang import FakeSGLang
from tests.bot.reports.test_sampler import ManualTime

NOW = 1_800_000_000.0


class NoExperiments:
    def describe(self, row: object) -> dict[str, object]:
        raise AssertionError("no experiment runs here")


def fleet(tmp_path: Path, url: str, count: int) -> Config:
    servers = {f"s{i:03d}": {"url": url} for i in range(count)}
    return parse({"servers": servers}, tmp_path / "kvpilot.toml")


@pytest.mark.parametrize(
    ("count", "asked"), [(1, 1), (LIVE_STATUS_MAX, LIVE_STATUS_MAX), (LIVE_STATUS_MAX + 1, 0)]
)
def test_a_fleet_status_asks_no_server_live(
    tmp_path: Path, db: Database, fake: FakeSGLang, count: int, asked: int
) -> None:
    config = fleet(tmp_path, fake.url, count)
    text = status_message(db, config, NoExperiments(), None, schedule=[]).text
    assert len([p for p in fake.requests if p in ("/health", "/health_generate")]) == asked
    said = f"{count} servers: their health is the sampler's"
    assert (said in text) == (asked == 0)
    assert text.count("• `s") == asked


def test_one_servers_status_is_asked_live_in_a_fleet(
    tmp_path: Path, db: Database, fake: FakeSGLang
) -> None:
    config = fleet(tmp_path, fake.url, 500)
    text = status_message(db, config, NoExperiments(), "s007", schedule=[]).text
    assert "• `s007`" in text and "healthy" in text and "servers: their health" not in text


def sample(name: str, ts: float) -> RawSample:
    return RawSample(server=name, ts=ts, span_s=15.0, dt=15.0)


def state(name: str, kind: str) -> ServerState:
    if kind == "up":
        return ServerState(name, loaded=True, last=sample(name, NOW - 10))
    if kind == "late":
        return ServerState(name, loaded=True, last=sample(name, NOW - 100))
    if kind == "down":
        gap = Gap(1, name, "down", NOW - 60, NOW - 60, True, False, "connection refused")
        return ServerState(name, loaded=True, gap=gap, last_error="connection refused")
    return ServerState(name)


def states(**kinds: int) -> dict[str, ServerState]:
    out: dict[str, ServerState] = {}
    for kind, count in kinds.items():
        out.update({f"{kind}{i:03d}": state(f"{kind}{i:03d}", kind) for i in range(count)})
    return out


@pytest.mark.parametrize(
    ("kinds", "first", "named", "more"),
    [
        ({"up": 3, "down": 1}, None, ["up000", "up001", "up002", "down000"], 0),
        ({"up": 500}, "500 up (0 not sampled for over 45 s), 0 down, 0 not sampled yet", [], 0),
        (
            {"up": 490, "down": 6, "late": 2, "unseen": 2},
            "492 up (2 not sampled for over 45 s), 6 down, 2 not sampled yet",
            ["down005", "late001", "unseen001"],
            0,
        ),
        (
            {"up": 400, "down": 100},
            "400 up (0 not sampled for over 45 s), 100 down, 0 not sampled yet",
            ["down019"],
            80,
        ),
    ],
)
def test_the_sampler_names_each_server_only_in_a_small_fleet(
    kinds: dict[str, int], first: str | None, named: list[str], more: int
) -> None:
    lines = server_lines(states(**kinds), NOW, 15.0)
    if first is None:  # a small fleet: one line each
        assert [line.split(":")[0].strip() for line in lines] == named
        return
    assert lines[0].strip() == first
    assert len(lines) <= SERVER_LINES + 3
    assert all(any(name in line for line in lines) for name in named)
    assert not any("up000" in line for line in lines)  # a healthy server is counted, not named
    assert (f"... and {more} more" in lines[-1]) == bool(more)


def test_the_sampler_describes_a_fleet_in_a_few_lines(tmp_path: Path, db: Database) -> None:
    config = fleet(tmp_path, "http://127.0.0.1:9", 300)
    lines = Sampler(config, db, ManualTime()).describe()
    assert "300 server(s)" in lines[0]
    assert lines[1].strip() == "0 up (0 not sampled for over 45 s), 0 down, 300 not sampled yet"
    assert len(lines) == 4 and lines[-1].strip() == f"... and {300 - SERVER_LINES} more"
