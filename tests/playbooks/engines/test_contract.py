"""What every registered engine must answer for a read-only diagnosis, with no server at hand.

Parametrized over the registry (`playbooks.engines.ENGINES`), so an engine added there is held
to it with no test written; the read-only stub (`stub_engine.py`) is registered here to show
that the smallest engine passes too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from playbooks.engines import ENGINES, NAMES, engine_named
from playbooks.engines.base import ArgError, Engine, Metrics, MetricsDisabled, Snapshot
from playbooks.engines.exits import ExitCause
from playbooks.engines.types import DiagnoseSettings, Measurement
from tests.playbooks.engines import stub_engine

STUB = "tgi"
STUB_IS_AN_ENGINE: Engine = stub_engine.ENGINE  # mypy checks it against the interface


@pytest.fixture(params=[*NAMES, STUB])
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    monkeypatch.setitem(ENGINES, STUB, stub_engine.__name__)
    yield engine_named(request.param)


def test_its_name_is_its_registry_key(engine: Engine) -> None:
    assert ENGINES[engine.name]
    assert engine.label and engine.metrics.prefix and engine.readiness_paths


def test_no_metrics_read_as_a_snapshot_or_as_none_exported(engine: Engine) -> None:
    metrics = engine.parse_metrics("")
    assert isinstance(metrics, Metrics) and not metrics.families
    # an engine may say its gauges are missing rather than that nothing runs
    with contextlib.suppress(MetricsDisabled):
        assert isinstance(engine.snapshot(metrics), Snapshot)


def test_a_stored_sample_reads_back(engine: Engine) -> None:
    stored = Snapshot(running=3.0, queued=1.0, kv_usage=0.5)
    assert engine.restore_snapshot(stored.to_json(), t=7.0) == stored.at(7.0)


def test_an_exit_reads_as_a_cause(engine: Engine) -> None:
    cause = engine.exit_cause(1, "Traceback (most recent call last):\nRuntimeError: boom\n")
    assert isinstance(cause, ExitCause) and cause.reason
    assert (
        engine.classify_exit(1, "RuntimeError: boom")
        == engine.exit_cause(1, "RuntimeError: boom").reason
    )


def test_no_change_is_no_change(engine: Engine) -> None:
    assert engine.parse_change([]) == {}
    assert engine.with_change(["--port", "8000"], {}) == ["--port", "8000"]


def test_an_unknown_argument_is_refused(engine: Engine) -> None:
    with pytest.raises(ArgError):
        engine.parse_change(["no_such_argument_anywhere=1"])


def test_its_words_are_its_own(engine: Engine) -> None:
    assert all(isinstance(word, str) and word for word in engine.vocabulary())


def test_the_stub_reads_only() -> None:
    engine = stub_engine.ENGINE
    rules = engine.rules_for(engine.parse_settings({"model_id": "m"}), DiagnoseSettings())
    assert rules.judge({"max_batch_total_tokens": 1}).verdict == "unsafe"
    m = Measurement(60, 30, 2, 0, "", "metrics", None, None, None, None, None, None, None,
                    4.0, 1.0, 2.0, 0.5, None, None, None, None, 0)  # fmt: skip
    assert rules.assess(m).bottleneck == "unknown"
    with pytest.raises(ArgError, match="reads TGI servers only"):
        engine.spell({"max_batch_total_tokens": 1})
