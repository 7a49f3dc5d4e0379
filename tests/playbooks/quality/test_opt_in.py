"""A lossy change under an answer quality check, and without one (pure)."""

from __future__ import annotations

import pytest

from playbooks.engines.base import Prompt
from playbooks.engines.types import Option, Verdict
from playbooks.quality.check import EvalCommand, GoldenPrompts, QualityCheck
from playbooks.quality.opt_in import guarded

GOLDEN = QualityCheck(
    ("kv_cache_dtype",), GoldenPrompts((Prompt(text="q"),), "golden.jsonl", 8, 0.9)
)
EVAL = QualityCheck(("kv_cache_dtype",), EvalCommand(("python", "eval.py"), "/etc/kvpilot"))


def option(verdict: Verdict, **change: object) -> Option:
    return Option("t", dict(change), verdict, None, None, "", ["FP8 KV costs accuracy"])


@pytest.mark.parametrize(
    ("given", "check", "verdict", "added"),
    [
        (option("needs_opt_in", kv_cache_dtype="fp8_e4m3"), None, "needs_opt_in", None),
        (option("needs_opt_in", kv_cache_dtype="fp8_e4m3"), GOLDEN, "possible",
         "opted in (kv_cache_dtype in lossy_ok): kept only if 1 golden prompts from "
         "golden.jsonl (at least 90% of answers identical) passes after the gate's keep"),
        (option("needs_opt_in", kv_cache_dtype="fp8_e4m3"), EVAL, "possible",
         "opted in (kv_cache_dtype in lossy_ok): kept only if the eval command `python eval.py` "
         "(exit status 0 within 600 s) passes after the gate's keep"),
        # an argument not opted in, even beside one that is: the engine's verdict stands
        (option("needs_opt_in", kv_cache_dtype="fp8_e4m3", page_size=64), GOLDEN, "needs_opt_in",
         None),
        (option("unsafe", kv_cache_dtype="fp8_e4m3"), GOLDEN, "unsafe", None),
        (option("recommended", kv_cache_dtype="auto"), GOLDEN, "recommended", None),
        (option("needs_opt_in"), GOLDEN, "needs_opt_in", None),  # an action, not a change
    ],
)  # fmt: skip
def test_a_check_makes_an_opted_in_lossy_change_proposable(
    given: Option, check: QualityCheck | None, verdict: str, added: str | None
) -> None:
    got = guarded(given, check)
    assert got.verdict == verdict
    assert got.reasons == given.reasons + ([added] if added else [])
