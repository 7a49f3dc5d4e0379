"""Whether a changed server still answers well enough: pure verdicts over recorded outcomes.

Golden answers are compared one by one with the baseline's: identical or not (greedy decoding
makes an unchanged server answer the same way), and how many words they share (SQuAD's F1
over whitespace-separated words, so a reworded ending costs less than a different answer). An
eval command passes on exit status 0. Each verdict carries the sentence an operator reads and
the numbers behind it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from playbooks.quality.check import EvalCommand, GoldenPrompts


@dataclass(frozen=True)
class QualityVerdict:
    passed: bool
    summary: str  # "7 of 20 golden answers changed (65% exact; tolerance 90%)"
    evidence: dict[str, Any]


@dataclass(frozen=True)
class EvalOutcome:
    """How the eval command ended, as its runner recorded it."""

    exit_code: int | None  # None: it did not start, or was killed at its timeout
    timed_out: bool = False
    error: str = ""  # why it could not start
    tail: str = ""  # the end of its output
    seconds: float = 0.0


def word_overlap(a: str, b: str) -> float:
    """F1 of the two answers' words (SQuAD's answer score): 1 for identical word bags, 0 for
    none in common; two empty answers agree."""
    words_a, words_b = a.split(), b.split()
    if not words_a and not words_b:
        return 1.0
    common = sum((Counter(words_a) & Counter(words_b)).values())
    return 2 * common / (len(words_a) + len(words_b))


def _percent(share: float) -> str:
    """A share as whole percent, rounded down: 89.5% is shown as 89%, never as a 90% that
    fails a 90% tolerance."""
    return f"{math.floor(share * 100 + 1e-9)}%"


def compare_answers(
    baseline: Sequence[str], trial: Sequence[str], golden: GoldenPrompts
) -> QualityVerdict:
    """The trial's golden answers against the baseline's, under the golden prompts' tolerance."""
    if len(baseline) != len(trial) or not baseline:
        raise ValueError(
            f"{len(baseline)} baseline and {len(trial)} trial answers: both need one per prompt"
        )
    n = len(baseline)
    same = sum(a == b for a, b in zip(baseline, trial, strict=True))
    exact = same / n
    overlap = sum(word_overlap(a, b) for a, b in zip(baseline, trial, strict=True)) / n
    passed = True
    numbers = []
    if golden.min_exact_match is not None:
        passed &= exact >= golden.min_exact_match - 1e-12
        numbers.append(f"{_percent(exact)} exact; tolerance {golden.min_exact_match * 100:g}%")
    if golden.min_token_overlap is not None:
        passed &= overlap >= golden.min_token_overlap - 1e-12
        numbers.append(
            f"mean word overlap {math.floor(overlap * 100 + 1e-9) / 100:.2f}; "
            f"tolerance {golden.min_token_overlap:g}"
        )
    return QualityVerdict(
        passed,
        f"{n - same} of {n} golden answers changed ({'; '.join(numbers)})",
        {
            "check": "golden",
            "prompts": n,
            "changed": n - same,
            "exact_match": round(exact, 4),
            "token_overlap": round(overlap, 4),
            "min_exact_match": golden.min_exact_match,
            "min_token_overlap": golden.min_token_overlap,
        },
    )


def judge_eval(outcome: EvalOutcome, command: EvalCommand) -> QualityVerdict:
    """The eval command's end as a verdict: only exit status 0 within its timeout passes."""
    evidence: dict[str, Any] = {
        "check": "command",
        "command": list(command.command),
        "exit_code": outcome.exit_code,
        "timed_out": outcome.timed_out,
        "seconds": round(outcome.seconds, 1),
    }
    last = outcome.tail.strip().splitlines()[-1:] if outcome.tail.strip() else []
    said = f": {last[0][:200]}" if last else ""
    if outcome.error:
        return QualityVerdict(False, f"the eval command could not start: {outcome.error}", evidence)
    if outcome.timed_out:
        return QualityVerdict(
            False,
            f"the eval command ran past its timeout ({command.timeout_s:g} s) and was stopped",
            evidence,
        )
    if outcome.exit_code == 0:
        return QualityVerdict(True, "the eval command exited 0", evidence)
    return QualityVerdict(
        False, f"the eval command exited {outcome.exit_code} (only 0 passes){said}", evidence
    )
