"""The answer quality check end to end on the incident twin, through `kvpilot experiment`.

The twin answers greedy prompts as a function of the prompt; started with the hidden
`--sim-fp8-answer-drift 0.3`, its answers to about 30% of prompts change once its KV cache is
8-bit, so a golden-prompt check that tolerates fewer changes fails for real. An 8-bit KV cache
doubles the incident's KV capacity, which the gate keeps: the check alone decides.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from bot.cli import exit_codes
from playbooks.experiments.outcome import ending
from sim.request import answer_drifts
from sim.tokenizer import encode
from storage import audit, quality_answers
from storage import experiments as store
from storage.db import open_db
from tests.faults.entry import FAULTY_CLI
from tests.playbooks.experiments.incident import MEASURING_SCALE, Workspace, incident_workspace
from tests.twin_process import REPO

DRIFT = 0.3
PROMPTS = [f"Question {i}: what is the capital of country number {i}?" for i in range(20)]
# which of them the twin answers differently with an 8-bit KV cache (the completion endpoint
# tokenizes a prompt as the twin's tokenizer does)
DRIFTING = sum(answer_drifts(tuple(encode(p)), DRIFT) for p in PROMPTS)
FP8 = "kv_cache_dtype=fp8_e4m3"
# reads the changed server the way an eval harness would, and fails on an 8-bit KV cache
EVAL = (
    "import json, os, sys, urllib.request; "
    "info = json.load(urllib.request.urlopen(os.environ['KVPILOT_SERVER_URL'] + '/server_info')); "
    "print('kv cache', info['kv_cache_dtype']); "
    "sys.exit(1 if info['kv_cache_dtype'].startswith('fp8') else 0)"
)


@contextmanager
def quality_workspace(tmp_path: Path, quality: str) -> Iterator[Workspace]:
    """The incident workspace with the twin's FP8 answer drift on and
    `[servers.incident.quality]` holding `quality`."""
    (tmp_path / "golden.jsonl").write_text(
        "".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS)
    )
    with incident_workspace(
        tmp_path,
        MEASURING_SCALE,
        "baseline_s = 360\n",
        twin_flags=("--sim-fp8-answer-drift", str(DRIFT)),
        more_config=f'\n[servers.incident.quality]\nlossy_ok = ["kv_cache_dtype"]\n{quality}',
    ) as w:
        yield w


def golden(min_exact_match: float) -> str:
    return f'prompts = "golden.jsonl"\nmax_tokens = 16\nmin_exact_match = {min_exact_match}\n'


def experiment(ws: Workspace) -> tuple[int, dict[str, Any], str]:
    code, out, err = ws.cli("experiment", "--server", "incident", "--set", FP8, "--yes", "--json")
    return code, (json.loads(out) if out.strip() else {}), err


def database(ws: Workspace) -> Any:
    return open_db(ws.config.parent / "var" / "kvpilot.db")


def test_the_drift_is_a_real_share_of_the_prompts() -> None:
    assert 3 <= DRIFTING <= 9, DRIFTING  # the cases below pass 50% and fail 90%


def test_an_opted_in_fp8_change_passing_its_golden_prompts_is_kept(tmp_path: Path) -> None:
    with quality_workspace(tmp_path, golden(0.5)) as ws:
        code, result, err = experiment(ws)
        assert code == 0, err
        assert result["state"] == "kept", (result["reason"], err)
        assert ws.info()["kv_cache_dtype"] == "fp8_e4m3"
        db = database(ws)
        exp = result["id"]
        path = [str(m.to_state) for m in store.transitions(db, exp)]
        assert path[-3:] == ["deciding", "checking_quality", "kept"], path
        summary = (
            f"{DRIFTING} of 20 golden answers changed ({100 - 5 * DRIFTING}% exact; tolerance 50%)"
        )
        assert store.transitions(db, exp)[-1].reason.endswith(f"answer quality held: {summary}")
        baseline = quality_answers.answers(db, exp, "baseline")
        trial = quality_answers.answers(db, exp, "trial")
        assert len(baseline) == len(trial) == 20 and all(baseline)
        assert sum(a != b for a, b in zip(baseline, trial, strict=True)) == DRIFTING
        # the baseline's answers were recorded before the restart, the trial's after the keep
        events = audit.events(db, experiment_id=exp)
        names = [e["name"] for e in events]
        first_note = names.index("note")
        assert first_note < names.index("restart_started") < names.index("verdict_reached")
        verdicts = [e["properties"]["verdict"] for e in events if e["name"] == "verdict_reached"]
        assert verdicts[-1] == "quality_passed"


def test_an_eval_command_that_exits_1_reverts_the_change(tmp_path: Path) -> None:
    quality = f"command = {json.dumps([sys.executable, '-c', EVAL])}\ntimeout_s = 120\n"
    with quality_workspace(tmp_path, quality) as ws:
        code, result, err = experiment(ws)
        assert code == exit_codes.BY_OUTCOME[ending_of(ws, result["id"]).outcome], err
        assert result["state"] == "reverted", (result, err)
        assert result["reason"] == (
            "the answer quality check failed: the eval command exited 1 (only 0 passes): "
            "kv cache fp8_e4m3"
        )
        assert ws.info()["kv_cache_dtype"] == "auto"
        db = database(ws)
        path = [str(m.to_state) for m in store.transitions(db, result["id"])]
        assert path[-4:] == ["deciding", "checking_quality", "reverting", "reverted"], path
        assert quality_answers.counts(db, result["id"]) == {}  # nothing to compare


def ending_of(ws: Workspace, exp: int) -> Any:
    db = database(ws)
    return ending(store.get_experiment(db, exp), store.transitions(db, exp))


@pytest.mark.serial
def test_a_bot_killed_after_recording_baseline_answers_resumes(tmp_path: Path) -> None:
    with quality_workspace(tmp_path, golden(0.9)) as ws:
        bot = subprocess.Popen(
            [
                *FAULTY_CLI,
                *("experiment", "--server", "incident"),
                *("--set", FP8, "--yes", "--config", str(ws.config)),
            ],
            cwd=REPO,
            env={**os.environ, "KVPILOT_FAULT_KILL_AFTER": "baseline:recordanswers"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        _, log = bot.communicate(timeout=120)
        assert bot.returncode == -signal.SIGKILL, log.decode()[-3000:]
        db = database(ws)
        (row,) = store.list_experiments(db)
        assert row.state == "baseline"
        assert quality_answers.counts(db, row.id) == {"baseline": 8}  # the first batch, stored
        started = time.monotonic()
        code, _out, err = ws.cli("resume")
        row = store.get_experiment(db, row.id)
        end = ending(row, store.transitions(db, row.id))
        assert code == exit_codes.BY_OUTCOME[end.outcome], err
        assert row.state == "reverted", (row.state, err, time.monotonic() - started)
        assert end.cause_code == "quality"
        assert end.cause == (
            f"the answer quality check failed: {DRIFTING} of 20 golden answers changed "
            f"({100 - 5 * DRIFTING}% exact; tolerance 90%)"
        )
        assert quality_answers.counts(db, row.id) == {"baseline": 20, "trial": 20}
        notes = [e["properties"]["text"] for e in audit.events(db, name="note")]
        assert notes[:3] == [  # each batch asked once: the resumed bot asked only the rest
            "golden answers 1-8 of 20 recorded from the server before the change",
            "golden answers 9-16 of 20 recorded from the server before the change",
            "golden answers 17-20 of 20 recorded from the server before the change",
        ]
        assert ws.info()["kv_cache_dtype"] == "auto"
        assert audit.events(db, name="bot_resumed")
