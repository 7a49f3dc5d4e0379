"""Every state an experiment can be in renders in chat with its own mark, and the terminal's
summary names how it ended and its exit code."""

from __future__ import annotations

from typing import Any

import pytest

from bot.chat.messages import Message
from bot.cli.experiment_summary import render_summary
from storage.experiments import TERMINAL, State


def progress(state: State) -> str:
    e = {
        "id": 3, "server": "kimi", "state": str(state), "change": "mem_fraction_static 0.88",
        "elapsed_s": 120.0, "remaining_s": 0.0, "terminal": state in TERMINAL,
    }  # fmt: skip
    return Message.from_template("chat/progress.md.j2", e=e, note="n").text


@pytest.mark.parametrize("state", sorted(set(State) - {State.proposed}))
def test_each_state_of_an_experiment_has_its_own_mark(state: State) -> None:
    text = progress(state)
    assert f"*{str(state).replace('_', ' ')}*" in text
    assert not text.startswith(":gear:"), text  # the mark of a state the template does not know


def test_a_superseded_experiment_says_a_person_took_over() -> None:
    assert progress(State.superseded).startswith(":raised_hand: *Experiment 3*")
    summary: dict[str, Any] = {
        "id": 3, "server": "kimi", "state": "superseded", "outcome": "superseded",
        "exit_code": 8, "reason": "the server's configuration was changed outside kvpilot",
        "then": "", "change": {"mem_fraction_static": 0.88}, "baseline": None,
        "baseline_source": None, "trial": None, "effect": None, "took_s": 60.0, "trial_s": None,
    }  # fmt: skip
    lines = render_summary(summary).splitlines()
    assert "  took      60.0 s (no trial)" in lines and "None" not in "\n".join(lines), lines
    first = lines[0]
    assert first == (
        "experiment 3 on kimi: SUPERSEDED (superseded: someone changed the server's configuration "
        "outside kvpilot during the experiment; kvpilot left it as they set it; exit 8)"
    )
