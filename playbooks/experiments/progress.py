"""What the steps of an experiment's current state have learnt: one typed record, stored per row.

Every step stores what it learnt before it returns (`advance._progress`), so a bot killed
between two steps continues from there; a move to another state starts it afresh. The steps
read it from one type, so a key's name and kind live in one place and a misspelt key fails
where it is written. It is stored as JSON with the experiment (`storage.experiments`) and with
a rollout's revert step (`storage.rollouts`): `from_json` reads every stored form, and a field
that is None is absent from `to_json`, as an unset key always was; readers give it the default
it had before the record had a type (`first_ts` the state's start, `looks` 0, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from playbooks.quality.eval_process import EvalRun
from storage.experiments import ExperimentRow


@dataclass(frozen=True, kw_only=True)
class Progress:
    """The current state's progress; every field None until a step records it."""

    # measuring (baseline, warm-up, trial): the samples' span, who took them, on which server
    first_ts: float | None = None  # the first stored scrape (epoch s)
    last_ts: float | None = None  # the newest stored scrape, or the measurement's start
    by: str | None = None  # the process that took it (a resumed one records a gap)
    instance: str | None = None  # the launcher's identity of the server measured
    until: float | None = None  # when the baseline or the warm-up has run long enough
    measured_because: str | None = None  # why the baseline was measured, not taken as stored
    batches: int | None = None  # the baseline's complete gate batches
    short_since: float | None = None  # when a baseline short of batches began measuring on
    looks: int | None = None  # trial batches the gate has looked at
    reading: str | None = None  # the newest reading's digest (`stall`)
    moved_ts: float | None = None  # when the readings last moved (`stall`)
    # restarting and reverting
    issued: float | None = None  # when the launcher was asked (None: not yet, or again)
    before: str | None = None  # the server's identity before that
    waiting_since: float | None = None  # waiting for one of the group's restart slots
    known_ready_s: float | None = None  # how long this server took to be ready before
    revert_failures: int | None = None  # reverts issued that failed (`restarts.RetryRevert`)
    retry_at: float | None = None  # when the failed revert is issued again
    # behind a router (`rotation_steps`)
    out_at: float | None = None  # taken out of rotation
    leave_tried_at: float | None = None
    quiet_at: float | None = None  # its last request finished
    rejoin_since: float | None = None
    rejoin_asked_at: float | None = None
    # the answer quality check (`quality_steps`)
    eval: EvalRun | None = None  # the eval command's run
    unanswered_since: float | None = None  # the server first failed to answer a prompt
    # approved, held by a freeze or a change window (`holds`, wall-clock epoch s)
    held_since: float | None = None
    hold: str | None = None
    hold_until: float | None = None
    approval_until: float | None = None
    changed_outside: str | None = None  # found changed by hand when the experiment was made

    def updated(self, **changes: Any) -> Progress:
        """This progress with `changes` (field names; None clears one); an unknown name fails."""
        if "eval" in changes and isinstance(changes["eval"], Mapping):
            changes = {**changes, "eval": EvalRun.from_json(dict(changes["eval"]))}
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = value.to_json() if isinstance(value, EvalRun) else value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Progress:
        """Read stored progress; keys no step writes any longer are left out."""
        known = {f.name for f in fields(cls)}
        return cls().updated(**{k: v for k, v in data.items() if k in known})


def progress_of(row: ExperimentRow) -> Progress:
    """The stored row's progress, typed."""
    return Progress.from_json(row.progress)
