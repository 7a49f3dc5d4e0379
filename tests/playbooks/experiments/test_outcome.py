"""How an experiment ended, read off its recorded moves, and the exit code each outcome has."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from bot.cli import exit_codes
from playbooks.experiments.outcome import Outcome, ending
from storage import experiments as store
from storage.db import memory_db
from storage.experiments import State

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
S = State

# (path of (state, actor, reason, details), outcome, exit code, cause begins with)
CASES: dict[str, tuple[list[tuple[State, str, str, dict[str, Any]]], Outcome, int, str]] = {
    "kept": (
        [(S.baseline, "kvpilot", "", {}), (S.restarting, "kvpilot", "", {}),
         (S.warming_up, "kvpilot", "", {}), (S.trial, "kvpilot", "", {}),
         (S.deciding, "kvpilot", "rose by 30%", {"verdict": "improved"}),
         (S.kept, "kvpilot", "rose significantly", {})],
        Outcome.kept, 0, "rose significantly",
    ),
    "not improved": (
        [(S.baseline, "kvpilot", "", {}), (S.restarting, "kvpilot", "", {}),
         (S.warming_up, "kvpilot", "", {}), (S.trial, "kvpilot", "", {}),
         (S.deciding, "kvpilot", "no gain", {"verdict": "not_improved"}),
         (S.reverting, "kvpilot", "no significant improvement", {"cause": "not_improved"}),
         (S.reverted, "kvpilot", "back on the last-known-good configuration", {})],
        Outcome.not_improved, 3, "no significant improvement",
    ),
    "died under load": (
        [(S.baseline, "kvpilot", "", {}), (S.restarting, "kvpilot", "", {}),
         (S.warming_up, "kvpilot", "", {}), (S.trial, "kvpilot", "", {}),
         (S.reverting, "kvpilot", "the changed server died under load: GPU out of memory",
          {"cause": "died"}),
         (S.reverted, "kvpilot", "back on the last-known-good configuration", {})],
        Outcome.reverted_after_failure, 4, "the changed server died under load: GPU out",
    ),
    "failed start": (
        [(S.baseline, "kvpilot", "", {}), (S.restarting, "kvpilot", "", {}),
         (S.reverting, "kvpilot", "the changed server did not start: x",
          {"cause": "failed_start"}),
         (S.reverted, "kvpilot", "back on the last-known-good configuration", {})],
        Outcome.reverted_after_failure, 4, "the changed server did not start",
    ),
    "guardrail": (
        [(S.baseline, "kvpilot", "", {}), (S.restarting, "kvpilot", "", {}),
         (S.warming_up, "kvpilot", "", {}), (S.trial, "kvpilot", "", {}),
         (S.deciding, "kvpilot", "TTFT doubled", {"verdict": "guardrail"}),
         (S.reverting, "kvpilot", "TTFT doubled", {"cause": "guardrail"}),
         (S.reverted, "kvpilot", "back", {})],
        Outcome.reverted_after_failure, 4, "TTFT doubled",
    ),
    "inconclusive": (
        [(S.baseline, "kvpilot", "", {}), (S.restarting, "kvpilot", "", {}),
         (S.warming_up, "kvpilot", "", {}), (S.trial, "kvpilot", "", {}),
         (S.deciding, "kvpilot", "undecided", {"verdict": "inconclusive"}),
         (S.reverting, "kvpilot", "undecided at the cap", {"cause": "inconclusive"}),
         (S.reverted, "kvpilot", "back", {})],
        Outcome.no_verdict, 5, "undecided at the cap",
    ),
    "drifted": (
        [(S.baseline, "kvpilot", "", {}), (S.restarting, "kvpilot", "", {}),
         (S.warming_up, "kvpilot", "", {}), (S.trial, "kvpilot", "", {}),
         (S.deciding, "kvpilot", "drift", {"verdict": "drifted"}),
         (S.reverting, "kvpilot", "the workload changed", {"cause": "drifted"}),
         (S.reverted, "kvpilot", "back", {})],
        Outcome.no_verdict, 5, "the workload changed",
    ),
    "aborted": (
        [(S.baseline, "kvpilot", "", {}), (S.restarting, "kvpilot", "", {}),
         (S.warming_up, "kvpilot", "", {}), (S.trial, "kvpilot", "", {}),
         (S.reverting, "cli:alice", "aborted by cli:alice in the terminal",
          {"cause": "aborted"}),
         (S.reverted, "kvpilot", "back", {})],
        Outcome.cancelled, 6, "aborted by cli:alice",
    ),
    "cancelled in the baseline": (
        [(S.baseline, "kvpilot", "", {}),
         (S.cancelled, "U1", "aborted by U1", {"cause": "aborted"})],
        Outcome.cancelled, 6, "aborted by U1",
    ),
    # nothing was changed, so nothing was reverted: cancelled, with the server's death as cause
    "the server died in the baseline": (
        [(S.baseline, "kvpilot", "", {}),
         (S.cancelled, "kvpilot", "the server went down during the baseline: exited",
          {"cause": "died"})],
        Outcome.cancelled, 6, "the server went down during the baseline",
    ),
    "revert failed": (
        [(S.baseline, "kvpilot", "", {}), (S.restarting, "kvpilot", "", {}),
         (S.reverting, "kvpilot", "the changed server did not start: x",
          {"cause": "failed_start"}),
         (S.failed, "kvpilot", "the revert failed: y; a person must restore the server", {})],
        Outcome.failed, 1, "the changed server did not start",
    ),
    "changed by hand during the trial": (
        [(S.baseline, "kvpilot", "", {}), (S.restarting, "kvpilot", "", {}),
         (S.warming_up, "kvpilot", "", {}), (S.trial, "kvpilot", "", {}),
         (S.superseded, "kvpilot", "the server's configuration was changed outside kvpilot",
          {"cause": "superseded", "found_args": ["--x"]})],
        Outcome.superseded, 8, "the server's configuration was changed outside kvpilot",
    ),
    # an abort's revert found a person's configuration: it is left, and that is the ending
    "aborted, then found changed by hand": (
        [(S.baseline, "kvpilot", "", {}), (S.restarting, "kvpilot", "", {}),
         (S.warming_up, "kvpilot", "", {}), (S.trial, "kvpilot", "", {}),
         (S.reverting, "cli:alice", "aborted by cli:alice in the terminal",
          {"cause": "aborted"}),
         (S.superseded, "kvpilot", "the server's configuration was changed outside kvpilot",
          {"cause": "superseded", "found_args": ["--x"]})],
        Outcome.superseded, 8, "the server's configuration was changed outside kvpilot",
    ),
    "recorded before causes were": (
        [(S.baseline, "kvpilot", "", {}), (S.restarting, "kvpilot", "", {}),
         (S.warming_up, "kvpilot", "", {}), (S.trial, "kvpilot", "", {}),
         (S.reverting, "U7", "aborted by U7", {}),
         (S.reverted, "kvpilot", "back", {})],
        Outcome.cancelled, 6, "aborted by U7",
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_outcome_names_the_cause_first(name: str) -> None:
    path, outcome, code, cause = CASES[name]
    db = memory_db()
    exp = store.create_experiment(
        db, server="s", change={}, baseline_config={}, trial_config={}, settings={},
        actor="U1", now=T0, state=State.approved,
    )  # fmt: skip
    for state, actor, reason, details in path:
        store.transition(db, exp, state, actor=actor, reason=reason, details=details, now=T0)
    row = store.get_experiment(db, exp)
    end = ending(row, store.transitions(db, exp))
    assert end.outcome == outcome
    assert exit_codes.BY_OUTCOME[end.outcome] == code
    assert end.cause.startswith(cause), end.cause
    if row.state in (State.reverted, State.failed) and len(path) > 1:
        assert end.then == path[-1][2]


def test_every_outcome_has_its_own_code_and_urgency_orders_them() -> None:
    codes = [exit_codes.BY_OUTCOME[o] for o in Outcome if o != Outcome.unfinished]
    assert sorted(codes) == [0, 1, 3, 4, 5, 6, 8]
    assert exit_codes.most_urgent([0, 6, 3]) == 3
    assert exit_codes.most_urgent([3, 8, 6]) == 8
    assert exit_codes.most_urgent([0, 4, 1]) == 1
    assert exit_codes.most_urgent([]) == 0
