"""The answer quality verdicts (pure), row by row: golden answers and the eval command."""

from __future__ import annotations

import pytest

from playbooks.engines.base import Prompt
from playbooks.quality.check import EvalCommand, GoldenPrompts
from playbooks.quality.compare import EvalOutcome, compare_answers, judge_eval, word_overlap

BASE = [f"answer {i} is forty two" for i in range(20)]
REWORDED = [a.replace("two", "three") for a in BASE]  # four of five words kept: F1 0.8


def golden(exact: float | None = 0.9, overlap: float | None = None) -> GoldenPrompts:
    prompts = tuple(Prompt(text=f"q{i}") for i in range(20))
    return GoldenPrompts(prompts, "golden.jsonl", 64, exact, overlap)


def changed(n: int, to: str = "something else entirely") -> list[str]:
    return [to if i < n else a for i, a in enumerate(BASE)]


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("the cat sat", "the cat sat", 1.0),
        ("", "", 1.0),
        ("the cat sat", "", 0.0),
        ("the cat sat", "a dog ran", 0.0),
        ("the cat sat", "the cat ran", 2 / 3),
        ("the the cat", "the cat cat", 2 * 2 / 6),  # words counted as a bag, with repeats
    ],
)
def test_word_overlap(a: str, b: str, expected: float) -> None:
    assert word_overlap(a, b) == pytest.approx(expected)
    assert word_overlap(b, a) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("trial", "check", "passed", "summary"),
    [
        (BASE, golden(), True, "0 of 20 golden answers changed (100% exact; tolerance 90%)"),
        (changed(2), golden(), True, "2 of 20 golden answers changed (90% exact; tolerance 90%)"),
        (changed(3), golden(), False, "3 of 20 golden answers changed (85% exact; tolerance 90%)"),
        (changed(7), golden(), False, "7 of 20 golden answers changed (65% exact; tolerance 90%)"),
        (  # a reworded ending keeps most words: the overlap tolerance passes it
            REWORDED, golden(None, 0.75), True,
            "20 of 20 golden answers changed (mean word overlap 0.80; tolerance 0.75)",
        ),
        (
            REWORDED, golden(None, 0.85), False,
            "20 of 20 golden answers changed (mean word overlap 0.80; tolerance 0.85)",
        ),
        (  # both tolerances: each must hold
            changed(2), golden(0.9, 0.95), False,
            "2 of 20 golden answers changed (90% exact; tolerance 90%; mean word overlap 0.90; "
            "tolerance 0.95)",
        ),
        (
            changed(1), golden(0.9, 0.9), True,
            "1 of 20 golden answers changed (95% exact; tolerance 90%; mean word overlap 0.95; "
            "tolerance 0.9)",
        ),
    ],
)  # fmt: skip
def test_golden_answers_against_the_tolerance(
    trial: list[str], check: GoldenPrompts, passed: bool, summary: str
) -> None:
    verdict = compare_answers(BASE, trial, check)
    assert (verdict.passed, verdict.summary) == (passed, summary)
    assert verdict.evidence["prompts"] == 20 and verdict.evidence["check"] == "golden"


def test_a_share_just_under_the_tolerance_is_not_shown_as_meeting_it() -> None:
    check = GoldenPrompts(tuple(Prompt(text=str(i)) for i in range(200)), "g.jsonl", 8, 0.9)
    base = [str(i) for i in range(200)]
    trial = ["x" if i < 21 else a for i, a in enumerate(base)]  # 89.5% identical
    verdict = compare_answers(base, trial, check)
    assert not verdict.passed
    assert verdict.summary == "21 of 200 golden answers changed (89% exact; tolerance 90%)"


def test_answers_must_pair_up() -> None:
    with pytest.raises(ValueError, match="one per prompt"):
        compare_answers(BASE, BASE[:-1], golden())
    with pytest.raises(ValueError, match="one per prompt"):
        compare_answers([], [], golden())


EVAL = EvalCommand(("python", "eval.py"), "/etc/kvpilot", 600.0)


@pytest.mark.parametrize(
    ("outcome", "passed", "summary"),
    [
        (EvalOutcome(0, seconds=12.3), True, "the eval command exited 0"),
        (
            EvalOutcome(1, tail="loading\naccuracy 0.71 < 0.80\n"), False,
            "the eval command exited 1 (only 0 passes): accuracy 0.71 < 0.80",
        ),
        (EvalOutcome(3), False, "the eval command exited 3 (only 0 passes)"),
        (EvalOutcome(-9), False, "the eval command exited -9 (only 0 passes)"),
        (
            EvalOutcome(None, timed_out=True), False,
            "the eval command ran past its timeout (600 s) and was stopped",
        ),
        (
            EvalOutcome(None, error="[Errno 2] No such file or directory: 'evl.py'"), False,
            "the eval command could not start: [Errno 2] No such file or directory: 'evl.py'",
        ),
    ],
)  # fmt: skip
def test_the_eval_command_passes_on_exit_status_zero(
    outcome: EvalOutcome, passed: bool, summary: str
) -> None:
    verdict = judge_eval(outcome, EVAL)
    assert (verdict.passed, verdict.summary) == (passed, summary)
    assert verdict.evidence["exit_code"] == outcome.exit_code
