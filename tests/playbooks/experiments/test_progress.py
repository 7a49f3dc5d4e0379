"""An experiment's stored progress reads into one typed record and is written back as it was."""

from __future__ import annotations

from typing import Any

import pytest

from playbooks.experiments import holds
from playbooks.experiments.progress import Progress
from playbooks.quality.eval_process import EvalRun

# Progress as steps stored it before the record had a type, one row per state.
STORED: list[dict[str, Any]] = [
    {  # approved, held by a freeze
        holds.HELD_SINCE: 1000.0, holds.HOLD: "frozen by U1", holds.HOLD_UNTIL: None,
        holds.APPROVAL_UNTIL: 5000, "changed_outside": "found changed by hand",
    },
    {  # baseline, measuring
        "until": 1600.0, "instance": "i1", "measured_because": "no stored window", "last_ts": 1300,
        "by": "bot-1", "first_ts": 1010.0, "batches": 4, "short_since": 1200.0,
        "reading": "ab12", "moved_ts": 1290.0,
    },
    {  # restarting behind a router, waiting for a slot
        "issued": 2000.0, "before": "i1", "waiting_since": None, "known_ready_s": 95.5,
        "out_at": 1990.0, "leave_tried_at": 1980.0, "quiet_at": None, "rejoin_since": 2100.0,
        "rejoin_asked_at": 2110.0,
    },
    {"looks": 3, "first_ts": 3000.0, "last_ts": 3300.0, "instance": "i2", "reading": None},
    {"eval": {"status": "/tmp/kvpilot-eval-1-x.json", "pid": 42, "host": "h"},
     "unanswered_since": 4000.0},
    {},
]  # fmt: skip


@pytest.mark.parametrize("stored", STORED)
def test_stored_progress_reads_and_writes_back_its_values(stored: dict[str, Any]) -> None:
    progress = Progress.from_json(stored)
    for key, value in stored.items():
        got = getattr(progress, key)
        assert (got.to_json() if isinstance(got, EvalRun) else got) == value
    # a key stored as null reads as absent, as every step read it
    assert progress.to_json() == {k: v for k, v in stored.items() if v is not None}


def test_keys_no_step_writes_are_left_out() -> None:
    assert Progress.from_json({"last_ts": 1.0, "retired_key": 2}) == Progress(last_ts=1.0)


def test_a_change_names_a_field_and_none_clears_it() -> None:
    progress = Progress(quiet_at=5.0).updated(out_at=6.0, quiet_at=None)
    assert progress.to_json() == {"out_at": 6.0}
    run = EvalRun("/tmp/s.json", 7, "h")
    assert Progress().updated(eval=run.to_json()).eval == run
    with pytest.raises(TypeError):
        Progress().updated(last_tss=1.0)  # a misspelt key fails where it is written
