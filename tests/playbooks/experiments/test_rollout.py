"""A rollout's decisions, row by row: which servers qualify, and the next move from its rows."""

from __future__ import annotations

from typing import Any

import pytest

from playbooks.experiments.rollout import (
    Abort,
    Candidate,
    Finish,
    Plan,
    Revert,
    ServerPlan,
    Start,
    Step,
    Wait,
    eligible,
    next_move,
)
from storage.experiments import State

SOURCE = Candidate("a", "sglang", "kimi", 95.59, 116_171, {"mem_fraction_static": 0.85})
TARGET = {"mem_fraction_static": 0.88}
ALREADY = (
    "nothing would change on `b`: mem_fraction_static is already 0.88 "
    "(`--mem-fraction-static 0.880` in its launch arguments as its process launcher reports them)"
)


def peer(**changes: Any) -> Candidate:
    fields: dict[str, Any] = {
        "name": "b", "engine": "sglang", "model": "kimi", "gpu_memory_gib": 95.59,
        "capacity_tokens": 116_500, "values": {"mem_fraction_static": 0.85}, **changes,
    }  # fmt: skip
    return Candidate(**fields)


@pytest.mark.parametrize(
    ("candidate", "why"),
    [
        (peer(), None),
        (peer(error="cannot reach SGLang at http://b"), "could not be read: cannot reach"),
        (peer(restartable=False), "no launcher"),
        (peer(busy="busy with experiment 7 (trial)"), "busy with experiment 7"),
        (peer(engine="vllm"), "runs vllm, not sglang"),
        (peer(model="llama"), "serves llama, not kimi"),
        (peer(gpu_memory_gib=79.65), "GPU memory 79.65 GiB per GPU, not 95.59 GiB"),
        (peer(gpu_memory_gib=None), "GPU memory unknown per GPU"),
        (peer(capacity_tokens=58_000), "KV capacity 58,000 tokens, not 116,171"),  # half the GPUs
        (peer(capacity_tokens=None), "KV capacity unknown"),
        (peer(values=TARGET), "runs the change already"),
        # what the engine makes of its arguments: 0.880 is 0.88 (read by no_change)
        (peer(values={"mem_fraction_static": "0.880"}, unchanged=ALREADY),
         f"runs the change already: {ALREADY}"),
        # ... and before its capacity, which the change itself moved
        (peer(capacity_tokens=124_000, unchanged=ALREADY), "runs the change already"),
        (peer(values={"mem_fraction_static": 0.80}), "not what the change was measured from"),
    ],
)  # fmt: skip
def test_which_servers_qualify(candidate: Candidate, why: str | None) -> None:
    found = eligible(SOURCE, candidate, TARGET)
    assert found == why if why is None else found is not None and why in found


def apply(
    server: str, state: State | None, status: str = "started", exp: int = 1, cause: str = ""
) -> Step:
    return Step(server, "apply", status, exp, state, cause or None)


def revert(server: str, status: str) -> Step:
    return Step(server, "revert", status)


SERVERS = ("b", "c", "d")


@pytest.mark.parametrize(
    ("batch", "rows", "expected"),
    [
        (1, [], Start(("b",))),
        (2, [], Start(("b", "c"))),
        (1, [apply("b", State.trial)], Wait("b measuring the change")),
        (1, [apply("b", State.kept)], Start(("c",))),
        (2, [apply("b", State.kept), apply("c", State.trial)], Start(("d",))),
        (1, [apply(s, State.kept) for s in SERVERS], Finish("done", "kept on all 3 server(s)")),
        # the first not kept: nothing else was changed
        (1, [apply("b", State.reverted)],
         Finish("reverted", "b ended reverted: the rollout stops; no server had been changed")),
        # ... after one was: revert it
        (1, [apply("b", State.kept), apply("c", State.reverted)], Revert("b")),
        (1, [apply("b", State.kept), apply("c", State.reverted), revert("b", "reverting")],
         Revert("b")),
        (1, [apply("b", State.kept), apply("c", State.failed), revert("b", "reverted")],
         Finish("reverted", "c ended failed: the rollout stops; reverted b")),
        # a step that could not start counts as not kept
        (1, [apply("b", State.kept), apply("c", State.cancelled, "not_started", 0)], Revert("b")),
        # two at once: one fails while the other runs: stop it first, wait, then revert
        (2, [apply("b", State.reverted, exp=1), apply("c", State.trial, exp=2)],
         Abort((2,), "b ended reverted: the rollout stops")),
        (2, [apply("b", State.reverted, exp=1), apply("c", State.reverting, "aborted", 2)],
         Wait("c reverting after the stop")),
        (2, [apply("b", State.kept, exp=1), apply("c", State.kept, exp=2),
             apply("d", State.expired, exp=3)], Revert("c")),  # newest first
        (2, [apply("b", State.kept, exp=1), apply("c", State.kept, exp=2),
             apply("d", State.expired, exp=3), revert("c", "reverted")], Revert("b")),
        (1, [apply("b", State.kept), apply("c", State.reverted), revert("b", "failed")],
         Finish("failed", "c ended reverted: the rollout stops; the revert of b failed: a person "
                "must act")),
        (1, [apply("b", State.kept), apply("c", State.reverted), revert("b", "left")],
         Finish("reverted", "c ended reverted: the rollout stops; left b as a person set it")),
        # a freeze or the change window held c: b keeps the change, nothing is restarted
        (1, [apply("b", State.kept), apply("c", State.cancelled, cause="held")],
         Finish("stopped", "c could not restart now (held): the rollout stops, b keeping the "
                "change; roll out again once the hold lifts")),
        (2, [apply("b", State.expired, exp=1, cause="expired_waiting"),
             apply("c", State.trial, exp=2)], Wait("c measuring before the rollout stops")),
        # a server that already ran the change was skipped: nothing restarted, not a failure
        (1, [apply("b", None, "skipped", 0), apply("c", State.kept), apply("d", State.kept)],
         Finish("done", "kept on 2 server(s); b already ran it")),
        (1, [apply("b", None, "skipped", 0)], Start(("c",))),
        (2, [apply(s, None, "skipped", 0) for s in SERVERS],
         Finish("done", "nothing to do: b, c, d already ran it")),
        (1, [apply("b", None, "skipped", 0), apply("c", State.kept), apply("d", State.reverted)],
         Revert("c")),
        # ... but a real failure beside it still reverts what was changed
        (2, [apply("b", State.kept, exp=1), apply("c", State.cancelled, exp=2, cause="held"),
             apply("d", State.reverted, exp=3)], Revert("b")),
    ],
)  # fmt: skip
def test_the_next_move(batch: int, rows: list[Step], expected: object) -> None:
    assert next_move(SERVERS, batch, rows) == expected


def test_a_plan_reads_back_as_it_was_approved() -> None:
    servers = (ServerPlan("b", ("--m", "0.85"), ("--m", "0.88")),)
    plan = Plan("kimi", 7, "a", {"mem_fraction_static": 0.88}, servers, 1, {"baseline_s": 600.0})
    assert Plan.from_json(plan.to_json()) == plan
