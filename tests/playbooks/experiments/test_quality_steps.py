"""The answer quality check's steps in the experiment engine, on a fake launcher and a fake
server (fast; the twin runs the same end to end in test_quality_twin.py).

The fake server answers each golden prompt with its own answer; running the 8-bit KV cache it
answers the first `drifting` prompts differently.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlite_utils import Database

from playbooks.clock import ManualClock
from playbooks.engines.base import Prompt
from playbooks.engines.sglang.client import SGLangClient
from playbooks.experiments import machine
from playbooks.experiments.machine import Deps
from playbooks.experiments.restart_limits import RestartLimiter
from playbooks.gate import GateSettings
from playbooks.quality.check import EvalCommand, GoldenPrompts, QualityCheck
from storage import audit, memory_db, quality_answers
from storage import experiments as store
from storage.experiments import State
from tests.playbooks.experiments.test_engine_slots import BASELINE, FakeLauncher

T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)
FP8 = {"kv_cache_dtype": "fp8_e4m3"}
PROMPTS = tuple(Prompt(text=f"question {i}") for i in range(10))


def golden(min_exact_match: float) -> QualityCheck:
    return QualityCheck(
        ("kv_cache_dtype",), GoldenPrompts(PROMPTS, "golden.jsonl", 16, min_exact_match)
    )


@dataclass
class FakeServer:
    """Answers completions; under fp8 KV the first `drifting` prompts get another answer."""

    launcher: FakeLauncher
    drifting: int = 0
    down: bool = False
    asked: list[str] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            return httpx.Response(503, text="overloaded")
        body = json.loads(request.content)
        assert request.url.path == "/v1/completions" and body["temperature"] == 0
        assert body["max_tokens"] == 16
        prompt = str(body["prompt"])
        self.asked.append(prompt)
        index = int(prompt.rsplit(maxsplit=1)[-1])
        fp8 = "fp8_e4m3" in self.launcher.args
        answer = f"answer {index}" + (" drifted" if fp8 and index < self.drifting else "")
        return httpx.Response(200, json={"choices": [{"index": 0, "text": answer}]})


@dataclass
class Bench:
    db: Database
    launcher: FakeLauncher
    server: FakeServer
    clock: list[datetime]

    def deps(self, quality: QualityCheck | None) -> Deps:
        """A fresh process's dependencies on the same database (as after a restart)."""
        client = SGLangClient(
            httpx.Client(base_url="http://sglang.test", transport=httpx.MockTransport(self.server))
        )
        return Deps(
            db=self.db, server="s", client=client, launcher=self.launcher, clock=ManualClock(),
            gate=GateSettings(), now=lambda: self.clock[0], quality=quality,
        )  # fmt: skip

    def later(self, seconds: float) -> None:
        self.clock[0] += timedelta(seconds=seconds)


@pytest.fixture
def bench() -> Bench:
    db = memory_db()
    launcher = FakeLauncher(RestartLimiter(db, "g", 1, now=lambda: T0))
    return Bench(db, launcher, FakeServer(launcher), [T0])


def advance_until(deps: Deps, exp: int, done: Callable[[store.ExperimentRow], bool]) -> None:
    for _ in range(50):
        if done(store.get_experiment(deps.db, exp)):
            return
        machine.advance(deps, exp)
    raise AssertionError(store.get_experiment(deps.db, exp))


def judged_by_the_gate(bench: Bench, deps: Deps, exp: int) -> None:
    """Fast-forward to the gate's keep on the changed server (the gate is tested elsewhere)."""
    row = store.get_experiment(bench.db, exp)
    path = [State.restarting, State.warming_up, State.trial, State.deciding]
    for state in [State.baseline, *path] if row.state == State.approved else path:
        store.transition(bench.db, exp, state, actor="t", reason="test", now=bench.clock[0])
    bench.launcher.started(row.trial_config["args"])
    store.set_result(bench.db, exp, {"action": "keep", "rule": "gain +40%"}, now=bench.clock[0])


def test_a_lossy_change_without_a_check_runs_as_before(bench: Bench) -> None:
    deps = bench.deps(None)
    exp = machine.create(deps, FP8, actor="u", approved_by="u", reason="t")
    assert "quality" not in store.get_experiment(bench.db, exp).settings
    judged_by_the_gate(bench, deps, exp)
    assert machine.advance(deps, exp).row.state == State.kept
    assert bench.server.asked == []


def test_a_check_guards_only_the_arguments_opted_in(bench: Bench) -> None:
    deps = bench.deps(golden(0.9))
    exp = machine.create(
        deps, {"mem_fraction_static": 0.88}, actor="u", approved_by="u", reason="t"
    )
    assert "quality" not in store.get_experiment(bench.db, exp).settings


@pytest.mark.parametrize(
    ("drifting", "tolerance", "state", "reason"),
    [
        (1, 0.9, State.kept, "gain +40%; answer quality held: 1 of 10 golden answers changed "
         "(90% exact; tolerance 90%)"),
        (3, 0.9, State.reverting, "the answer quality check failed: 3 of 10 golden answers "
         "changed (70% exact; tolerance 90%)"),
    ],
)  # fmt: skip
def test_golden_answers_before_the_restart_and_after_the_gates_keep(
    bench: Bench, drifting: int, tolerance: float, state: State, reason: str
) -> None:
    bench.server.drifting = drifting
    deps = bench.deps(golden(tolerance))
    exp = machine.create(deps, FP8, actor="u", approved_by="u", reason="t")
    assert store.get_experiment(bench.db, exp).settings["quality"]["lossy_ok"] == ["kv_cache_dtype"]
    machine.advance(deps, exp)  # approved -> baseline
    assert machine.advance(deps, exp).step == "recordanswers"  # prompts 1-8, before measuring
    # a fresh process (the bot restarted) asks only the two prompts still unanswered
    deps = bench.deps(None)  # (the check comes from the experiment, not the new process)
    assert machine.advance(deps, exp).step == "recordanswers"
    # each prompt once (the step asks its prompts at once, so in no fixed order)
    assert sorted(bench.server.asked) == sorted(str(p.text) for p in PROMPTS)
    assert machine.advance(deps, exp).step == "choosebaseline"
    assert quality_answers.answers(bench.db, exp, "baseline") == [f"answer {i}" for i in range(10)]
    judged_by_the_gate(bench, deps, exp)
    moved = machine.advance(deps, exp).row
    assert moved.state == State.checking_quality
    assert store.transitions(bench.db, exp)[-1].reason == (
        "gain +40%; checking answer quality before keeping it: 10 golden prompts from "
        "golden.jsonl (at least 90% of answers identical)".replace("90%", f"{tolerance:.0%}")
    )
    advance_until(deps, exp, lambda r: r.state != State.checking_quality)
    row = store.get_experiment(bench.db, exp)
    assert row.state == state
    move = store.transitions(bench.db, exp)[-1]
    assert move.reason == reason and move.from_state == State.checking_quality
    assert row.result is not None and row.result["quality"]["changed"] == drifting
    assert row.result["rule"] == "gain +40%"  # the gate's result is kept beside it
    notes = [e["properties"]["text"] for e in audit.events(bench.db, name="note")]
    assert notes == [
        "golden answers 1-8 of 10 recorded from the server before the change",
        "golden answers 9-10 of 10 recorded from the server before the change",
        "golden answers 1-8 of 10 recorded from the changed server",
        "golden answers 9-10 of 10 recorded from the changed server",
    ]
    (verdict,) = audit.events(bench.db, name="verdict_reached")
    passed = state == State.kept
    assert verdict["properties"]["verdict"] == ("quality_passed" if passed else "quality_failed")
    if not passed:
        assert move.details["cause"] == "quality"
        assert machine.run(deps, exp).state == State.reverted
        assert bench.launcher.args == BASELINE


def test_a_server_that_does_not_answer_cancels_the_baseline(bench: Bench) -> None:
    deps = bench.deps(golden(0.9))
    exp = machine.create(deps, FP8, actor="u", approved_by="u", reason="t")
    machine.advance(deps, exp)
    bench.server.down = True
    machine.advance(deps, exp)
    row = store.get_experiment(bench.db, exp)
    assert row.state == State.baseline and row.progress["unanswered_since"] == T0.timestamp()
    bench.later(GateSettings().gap_limit_s + 1)
    row = machine.advance(deps, exp).row
    assert row.state == State.cancelled
    assert store.transitions(bench.db, exp)[-1].reason.startswith(
        "the server did not answer the golden prompts for 121 s (http://sglang.test/v1/"
        "completions answered HTTP 503: overloaded"
    )
    assert bench.launcher.applied == []  # nothing was changed


@pytest.mark.parametrize(("code", "state"), [(0, State.kept), (1, State.reverting)])
def test_an_eval_command_decides_after_the_gates_keep(
    bench: Bench, tmp_path: Path, code: int, state: State
) -> None:
    script = f"import os, sys; print(os.environ['KVPILOT_SERVER_URL']); sys.exit({code})"
    check = QualityCheck(
        ("kv_cache_dtype",), EvalCommand((sys.executable, "-c", script), str(tmp_path), 60.0)
    )
    deps = bench.deps(check)
    exp = machine.create(deps, FP8, actor="u", approved_by="u", reason="t")
    machine.advance(deps, exp)
    assert machine.advance(deps, exp).step == "choosebaseline"  # nothing to record before
    judged_by_the_gate(bench, deps, exp)
    assert machine.advance(deps, exp).row.state == State.checking_quality
    assert machine.advance(deps, exp).step == "starteval"
    deadline = time.monotonic() + 60  # a real process: its end is waited for, not counted
    while machine.advance(deps, exp).row.state == State.checking_quality:
        assert time.monotonic() < deadline, "the eval command never finished"
        time.sleep(0.02)
    row = store.get_experiment(bench.db, exp)
    assert row.state == state
    reason = store.transitions(bench.db, exp)[-1].reason
    if code == 0:
        assert reason == "gain +40%; answer quality held: the eval command exited 0"
    else:
        assert reason == (
            "the answer quality check failed: the eval command exited 1 (only 0 passes): "
            "http://sglang.test"
        )
