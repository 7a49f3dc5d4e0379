"""The room a smaller prefill chunk frees, measured on a kept step, and the campaign step it
lets through: the numbers are the twin's (incident, hidden peak x2.18, `bench/tune.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from playbooks.campaigns.cutdown import fitted
from playbooks.campaigns.policy import Tried, choose_next
from playbooks.campaigns.room import (
    GIB,
    ChunkCredit,
    GpuRoom,
    RoomBefore,
    chunk_credit,
    credited,
    read_after,
    read_before,
)
from playbooks.engines.base import EngineError
from playbooks.engines.types import Option, Verdict
from playbooks.sources.gpu import FakeGpuReader, GpuState

KEY = "chunked_prefill_size"
KEPT = Tried({KEY: 4096, "mem_fraction_static": 0.89}, kept=True, cause="improved")


@pytest.mark.parametrize(
    ("chunks", "rooms", "added", "per_token"),
    [
        # 8192 -> 4096 and 0.85 -> 0.89 (3.81 GiB more pool): 1.36 GiB free before, 1.93 after,
        # so the 4096 tokens given up had taken 1.93 - 1.36 + 3.81 = 4.38 GiB
        ((8192, 4096), (1.36, 1.93), 3.81, 4.38 / 4096),
        ((8192, 4096), (7.28, 5.48), 3.81, 2.01 / 4096),  # the same step at the modelled peak
        ((4096, 4096), (1.36, 1.93), 3.81, None),  # the chunk stayed: nothing to learn
        ((4096, 8192), (1.36, 1.93), 3.81, None),  # a larger chunk is not what it measures
        ((8192, 4096), (5.0, 1.0), 3.81, None),  # less room than the pool explains: no credit
        ((8192, 0), (1.0, 2.0), 0.0, None),
        ((8192, 8000), (1.36, 1.40), 0.0, None),  # 192 tokens: the readings' noise, at scale
        ((4096, 1024), (1.0, 3.0), 0.0, 2.0 / 2048),  # activations stop shrinking below 2048
    ],
)
def test_a_kept_step_that_shrank_the_chunk_shows_what_a_chunk_token_takes(
    chunks: tuple[int, int], rooms: tuple[float, float], added: float, per_token: float | None
) -> None:
    credit = chunk_credit(KEY, chunks, rooms, added)
    if per_token is None:
        assert credit is None
    else:
        assert credit is not None and credit.chunk == chunks[1]
        assert credit.gib_per_token == pytest.approx(per_token)


@pytest.mark.parametrize(
    ("change", "freed"),
    [
        ({KEY: 2048, "mem_fraction_static": 0.92}, 2.19),  # half the chunk: half of 4.38
        ({"mem_fraction_static": 0.92}, 0.0),  # keeps the chunk
        ({KEY: 4096}, 0.0),
        ({KEY: 8192}, 0.0),  # larger: takes more, credited nothing
        ({KEY: True}, 0.0),  # not a chunk
        ({KEY: "2048"}, 0.0),
        ({KEY: 1024}, 2.19),  # nothing below 2048
    ],
)
def test_what_a_change_gives_back(change: dict[str, Any], freed: float) -> None:
    credit = ChunkCredit(KEY, 4096, 4.38 / 4096, 4.38)
    assert credit.freed(change) == pytest.approx(freed)


def test_the_room_counts_what_the_smaller_chunk_frees_and_says_so() -> None:
    room = GpuRoom(1.93, "NVML", ChunkCredit(KEY, 4096, 4.38 / 4096, 4.38))
    assert room.refusal(2.87, {"mem_fraction_static": 0.92}) is not None  # 0.06 GiB left
    assert room.refusal(2.87, {KEY: 2048, "mem_fraction_static": 0.92}) is None  # 1.25 left
    refused = room.refusal(3.83, {KEY: 2048, "mem_fraction_static": 0.93})
    assert refused is not None and "2.2 GiB its smaller prefill chunk frees" in refused
    assert GpuRoom(1.93, "NVML").refusal(2.87, {KEY: 2048}) is not None  # nothing measured


STEP = {KEY: 4096, "mem_fraction_static": 0.89}


def test_credited_needs_both_readings_and_whole_chunks() -> None:
    after = GpuRoom(1.93, "NVML")
    before = RoomBefore(1.36, 8192, 3.81, STEP)
    room = credited(after, before, 4096, KEY)
    assert room is not None and room.chunk is not None
    assert room.chunk.gib_per_token == pytest.approx(4.38 / 4096)
    assert credited(after, None, 4096, KEY) == after
    assert credited(None, before, 4096, KEY) is None
    assert credited(after, before, 4096, None) == after  # an engine that trades no chunk
    assert credited(after, RoomBefore(1.36, None, 3.81, STEP), 4096, KEY) == after
    assert credited(after, RoomBefore(1.36, 8192, 3.81, STEP), -1.0, KEY) == after
    # a step that moved other memory (attention DP's ranks) or did not set the chunk teaches
    # nothing about the chunk
    other = {**STEP, "attn_dp_size": 8}
    assert credited(after, RoomBefore(1.36, 8192, 3.81, other), 4096, KEY) == after
    fraction = {"mem_fraction_static": 0.89}
    assert credited(after, RoomBefore(1.36, 8192, 3.81, fraction), 4096, KEY) == after


@pytest.mark.parametrize(
    "stored",
    [
        {"free_gib": 1.36, "chunk": 8192, "adds_gib": 3.81, "change": STEP},
        {"free_gib": 2, "chunk": None},
    ],
)
def test_the_room_before_a_step_is_stored_with_its_proposal(stored: dict[str, Any]) -> None:
    before = RoomBefore.from_json(stored)
    assert before is not None
    assert RoomBefore.from_json(before.to_json()) == before


@pytest.mark.parametrize("stored", [None, {}, {"free_gib": "lots"}, [1.36], "1.36"])
def test_a_snapshot_without_a_room_reads_back_as_none(stored: Any) -> None:
    assert RoomBefore.from_json(stored) is None


@dataclass
class FakeSettings:
    settings: dict[str, Any]


@dataclass
class FakeEngine:
    chunk_arg: str | None = KEY

    def chunk_of(self, info: FakeSettings) -> Any:
        return info.settings.get(self.chunk_arg) if self.chunk_arg else None


class FakeClient:
    """What the room readers ask of a client: its engine and its settings now."""

    def __init__(self, chunk: Any, fails: bool = False, engine: FakeEngine | None = None):
        self.engine = engine or FakeEngine()
        self.chunk, self.fails = chunk, fails

    def settings(self) -> FakeSettings:
        if self.fails:
            raise EngineError("down")
        return FakeSettings({KEY: self.chunk})


def gpus(*free: float) -> FakeGpuReader:
    return FakeGpuReader(
        [
            GpuState(
                i, "H200", f"GPU-{i}", 100 * GIB, round((100 - f) * GIB), round(f * GIB), None, None
            )
            for i, f in enumerate(free)
        ]
    )


def test_the_readers_take_the_tightest_gpu_and_the_chunk_the_server_runs() -> None:
    client: Any = FakeClient(8192)
    before = read_before(gpus(2.0, 1.5), "NVML", client, 3.81, STEP)
    assert before == RoomBefore(1.5, 8192, 3.81, STEP)
    client.chunk = 4096
    after = read_after(gpus(2.0, 3.0), "NVML", client, before)
    assert after is not None and after.free_gib == 2.0
    assert after.chunk is not None and after.chunk.chunk == 4096
    assert read_before(None, "none", client, 3.81, STEP) is None  # no GPUs to read
    down: Any = FakeClient(8192, fails=True)
    assert read_before(gpus(1.5), "NVML", down, 3.81, STEP) == RoomBefore(1.5, None, 3.81, STEP)
    vllm: Any = FakeClient(8192, engine=FakeEngine(None))
    assert read_before(gpus(1.5), "NVML", vllm, None, {}) == RoomBefore(1.5, None, None)


def pair_rules(now: float, chunk: int) -> Any:
    """Rules for a server at fraction `now` and `chunk`: each hundredth above `now` adds 0.955
    GiB and 1-2 points of gain; past 0.92 at the server's chunk, or 0.93 at half of it, is
    unsafe (their activation floors)."""

    def reassess(changes: Any) -> list[Option]:
        out = []
        for change in changes:
            fraction = change["mem_fraction_static"]
            steps = round((fraction - now) * 100)
            edge = 0.93 if change.get(KEY, chunk) < chunk else 0.92
            verdict: Verdict = "unsafe" if fraction > edge + 1e-9 else "possible"
            gain = (0.01 * steps, 0.02 * steps)
            added = 0.955 * steps if steps > 0 else None
            out.append(Option(str(change), change, verdict, None, gain, "", [], True, added))
        return out

    return reassess


def test_a_step_too_large_for_the_room_is_taken_with_half_the_chunk_where_that_was_measured() -> (
    None
):
    """After 4096 and 0.89 were kept at the highest hidden peak, 0.92 does not fit the 1.93 GiB
    left, nor does 0.90; with half the chunk, which the kept step showed frees 2.19 GiB, 0.92
    does (0.93 is past the rules' edge even there)."""
    edge = Option("mem_fraction_static=0.92", {"mem_fraction_static": 0.92}, "possible", None,
                  (0.06, 0.12), "", [], False, 2.87)  # fmt: skip
    rules = pair_rules(0.89, 4096)
    plain = GpuRoom(1.93, "NVML")
    assert choose_next([edge], tried=[KEPT], room=plain, reassess=rules).option is None
    room = GpuRoom(1.93, "NVML", ChunkCredit(KEY, 4096, 4.38 / 4096, 4.38))
    choice = choose_next([edge], tried=[KEPT], room=room, reassess=rules)
    assert choice.option is not None
    assert choice.option.change == {"mem_fraction_static": 0.92, KEY: 2048}
    # a step that already names a chunk is only cut down, never halved again
    paired = Option("pair", {KEY: 4096, "mem_fraction_static": 0.92}, "possible", None,
                    (0.06, 0.12), "", [], False, 2.87)  # fmt: skip
    assert all(KEY not in o.change or o.change[KEY] == 4096 for o in fitted([paired], room, rules))


class BrokenReader:
    def snapshot(self) -> Any:
        raise RuntimeError("NVML_ERROR_GPU_IS_LOST")


def test_a_gpu_read_that_fails_midway_is_no_room_not_an_error() -> None:
    from playbooks.campaigns.room import room_of  # noqa: PLC0415

    reader: Any = BrokenReader()
    assert room_of(reader, "NVML") is None


def test_the_chunk_is_not_halved_below_where_activations_stop_shrinking() -> None:
    edge = Option("mem_fraction_static=0.92", {"mem_fraction_static": 0.92}, "possible", None,
                  (0.06, 0.12), "", [], False, 2.87)  # fmt: skip
    room = GpuRoom(1.93, "NVML", ChunkCredit(KEY, 2048, 4.38 / 4096, 4.38))
    assert all(KEY not in o.change for o in fitted([edge], room, pair_rules(0.89, 2048)))


@pytest.mark.parametrize(
    ("settings", "chunk"),
    [
        ({KEY: 8192}, 8192),
        ({KEY: 1024, "enable_dp_attention": True}, None),  # reported per rank: not the flag's
        ({KEY: -1}, None),  # chunking off
        ({}, None),
        ({KEY: True}, None),
    ],
)
def test_sglang_says_the_chunk_in_the_flags_units_or_not_at_all(
    settings: dict[str, Any], chunk: int | None
) -> None:
    from playbooks.engines.sglang import ENGINE  # noqa: PLC0415

    info: Any = FakeSettings(settings)
    assert ENGINE.chunk_of(info) == chunk
