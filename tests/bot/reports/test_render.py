"""Rendering: the text, valid Block Kit within Slack's limits, and a chart that shows the data."""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.image import imread
from slack_sdk.models.blocks import Block
from sqlite_utils import Database

from bot.chat.auth import Principal
from bot.chat.messages import Header, Message
from bot.reports.report import (
    EFFECTIVE_COLOUR,
    GENERATION_COLOUR,
    VERDICT_COLOURS,
    Zone,
    chart_filename,
    post_report,
    render_chart,
    render_text,
    report_message,
    summary_line,
)
from bot.slack.blocks import MAX_BLOCKS, blocks
from playbooks.reports.throughput import Report, build_report
from storage.chat import MessageRef
from storage.db import open_db, write_transaction
from storage.experiments import State, create_experiment, set_result, transition
from storage.metric_buckets import RawSample
from storage.metric_samples import add_gap, add_samples
from storage.server_snapshots import record_snapshot

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
DAY = timedelta(days=1)
INFO = {
    "version": "0.5.10",
    "mem_fraction_static": 0.85,
    "max_total_num_tokens": 116171,
    "tp_size": 8,
    "internal_states": [{"memory_usage": {"weight": 69.25, "kvcache": 7.6, "graph": 2.0}}],
}


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Database]:
    database = open_db(tmp_path / "kvpilot.db")
    yield database
    database.close()


def store_day(db: Database, rate: tuple[float, float] = (800.0, 800.0)) -> None:
    """A day at 15 s: decode at ``rate[0]`` tok/s in the first half, ``rate[1]`` in the second;
    completed requests' tokens at three quarters of that."""
    t0 = START.timestamp()
    rows = []
    for i in range(5760):
        tp = rate[0] if i < 2880 else rate[1]
        rows.append(
            RawSample(
                server="s",
                ts=t0 + 15 * i,
                span_s=15.0,
                dt=None if i == 0 else 15.0,
                gen_total=0.75 * tp * 15 * i,
                gen_tokens=None if i == 0 else 0.75 * tp * 15,
                requests=None if i == 0 else 1.0,
                prompt_tokens=None if i == 0 else 400.0,
                decode_rate=tp,
                running=50.0,
                queued=100.0 * tp / 800,
                token_usage=0.92,
                max_total_tokens=116171,
            )
        )
    add_samples(db, rows)
    record_snapshot(db, "s", t0, INFO)


def add_experiment(db: Database, state: State, at: datetime, effect: float) -> int:
    exp = create_experiment(
        db,
        server="s",
        change={"mem_fraction_static": 0.88},
        baseline_config={"args": []},
        trial_config={"args": []},
        settings={},
        actor="test",
        now=at,
        state=State.deciding,
    )
    set_result(
        db,
        exp,
        {
            "verdict": "improved" if state == State.kept else "no_gain",
            "rule": "the decode rate rose significantly",
            "baseline": {"mean": 850.0, "ci95": [840.0, 860.0]},
            "trial": {"mean": 850.0 * (1 + effect), "ci95": None},
            "effect": {"mean": effect, "ci95": [effect - 0.03, effect + 0.03]},
        },
        now=at,
    )
    if state == State.reverted:
        transition(db, exp, State.reverting, actor="test", reason="x", now=at + timedelta(hours=1))
    transition(db, exp, state, actor="test", reason="decided", now=at + timedelta(hours=1))
    return exp


def report(db: Database) -> Report:
    return build_report(db, "s", since=START, until=START + DAY)


def test_text_has_the_numbers_the_changes_and_the_verdicts(db: Database) -> None:
    store_day(db)
    add_experiment(db, State.kept, START + timedelta(hours=3), 0.27)
    record_snapshot(
        db, "s", (START + timedelta(hours=4)).timestamp(), {**INFO, "mem_fraction_static": 0.88}
    )
    add_gap(
        db,
        "s",
        "down",
        (START + timedelta(hours=4)).timestamp(),
        (START + timedelta(hours=4, minutes=8)).timestamp(),
        restarted=True,
    )
    text = render_text(report(db), "Europe/Berlin")
    assert "kvpilot report: s, 2026-03-02 10:00 CET to 2026-03-03 10:00 CET (24 h)" in text
    assert "51,831,000 tokens generated, 5,759 requests completed" in text
    assert "generation 800 tok/s on average, peak 800" in text
    assert "effective  600 tok/s on average, best 5 minutes 600" in text
    assert "queue non-empty 100%" in text
    assert "p50 0.92" in text
    assert "1 restart, down 8 min" in text
    assert "#1 mem_fraction_static=0.88: kept, decode rate +27.0% (95% CI +24.0%..+30.0%)" in text
    assert "850 -> 1,080 tok/s" in text
    assert "mem_fraction_static: 0.85 -> 0.88" in text
    assert "Bottleneck    kv_cache" in text


def render_blocks(r: Report, tz: Zone | None = None) -> list[dict[str, Any]]:
    """The report's message as Slack renders it."""
    return blocks(report_message(r, tz))


def test_blocks_are_valid_block_kit_within_slack_limits(db: Database) -> None:
    store_day(db)
    add_experiment(db, State.reverted, START + timedelta(hours=2), -0.01)
    blocks = render_blocks(report(db), "Europe/Berlin")
    assert 4 <= len(blocks) <= MAX_BLOCKS
    for block in blocks:
        parsed = Block.parse(block)  # raises on any Slack limit
        assert parsed is not None and parsed.to_dict() == block
    fields = next(b["fields"] for b in blocks if "fields" in b)
    assert len(fields) <= 10 and any("Tokens generated" in f["text"] for f in fields)
    assert blocks[0]["type"] == "header" and "s" in blocks[0]["text"]["text"]
    text = str(blocks)
    assert "*reverted*" in text and "-1.0%" in text


def test_blocks_stay_within_limits_however_much_happened(db: Database) -> None:
    store_day(db)
    with write_transaction(db):  # one commit for the lot
        for i in range(80):
            add_experiment(db, State.reverted, START + timedelta(minutes=15 * i), -0.01 * (i % 5))
        for i in range(150):
            t = (START + timedelta(minutes=9 * i)).timestamp()
            add_gap(db, "s", "down", t, t + 30, detail="x" * 500)
    blocks = render_blocks(report(db))
    assert len(blocks) <= MAX_BLOCKS
    for block in blocks:
        Block.parse(block)
        if block["type"] == "section" and "text" in block:
            assert len(block["text"]["text"]) <= 3000
    assert "more" in str(blocks)  # the lists say how much they left out


def colour_mask(png: bytes, colour: str, tolerance: float = 0.08) -> np.ndarray:
    image = imread(io.BytesIO(png), format="png")[..., :3]
    rgb = np.array([int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    return np.asarray(np.all(np.abs(image - rgb) < tolerance, axis=-1))


def test_the_chart_is_a_png_that_shows_the_data(db: Database, tmp_path: Path) -> None:
    store_day(db, rate=(900.0, 300.0))  # a fall in throughput at half time
    add_experiment(db, State.kept, START + timedelta(hours=15), 0.2)
    png = render_chart(report(db), "Europe/Berlin")
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    image = imread(io.BytesIO(png), format="png")
    assert image.shape[0] >= 400 and image.shape[1] >= 800
    blue = colour_mask(png, GENERATION_COLOUR)
    rows, cols = np.nonzero(blue)
    assert len(rows) > 500  # a line across the day, not only the legend's sample
    # the line is high on the left and low on the right (image rows grow downwards)
    middle = image.shape[1] / 2
    left = rows[(cols > 0.2 * image.shape[1]) & (cols < middle - 50)]
    right = rows[(cols > middle + 50) & (cols < 0.9 * image.shape[1])]
    assert left.size and right.size and np.median(left) < np.median(right) - 50
    assert colour_mask(png, EFFECTIVE_COLOUR).sum() > 300
    # the experiment is marked in its verdict's colour (a light band and its label)
    assert colour_mask(png, VERDICT_COLOURS["kept"], tolerance=0.1).sum() > 20
    # an empty day draws axes but no line
    empty = render_chart(build_report(db, "nobody", since=START, until=START + DAY))
    assert colour_mask(empty, GENERATION_COLOUR).sum() < 0.2 * len(rows)


class RecordingSurface:
    """A surface that keeps what it was given."""

    channel = "C0REPORTS"

    def __init__(self) -> None:
        self.posted: list[Message] = []
        self.uploads: list[tuple[str, MessageRef | None]] = []

    def post(self, message: Message, *, thread: MessageRef | None = None) -> MessageRef:
        self.posted.append(message)
        return MessageRef(self.channel, str(len(self.posted)))

    def update(self, ref: MessageRef, message: Message) -> None:
        raise AssertionError("a report is never edited")

    def progress(self, ref: MessageRef, message: Message) -> None:
        self.update(ref, message)

    def upload(
        self, data: bytes, *, filename: str, title: str, thread: MessageRef | None = None
    ) -> None:
        assert data.startswith(b"\x89PNG")
        self.uploads.append((filename, thread))

    def whisper(self, who: Principal, message: Message) -> None:
        raise AssertionError("a report is posted, not whispered")


def test_a_report_goes_out_through_a_surface_with_its_chart_in_the_thread(db: Database) -> None:
    store_day(db)
    r = report(db)
    surface = RecordingSurface()
    ref = post_report(surface, r, tz="Europe/Berlin")
    (message,) = surface.posted
    assert message.text == render_text(r, "Europe/Berlin")
    assert message.notification == summary_line(r, "Europe/Berlin")
    assert message.parts[0] == Header("Throughput report: s") and not message.buttons
    assert surface.uploads == [(chart_filename(r), ref)]
