"""Taking the answer quality check's steps: golden prompts asked, answers judged, the eval run.

Each step is short and leaves what it learnt in the database before it returns: a batch of
golden answers (`storage.quality_answers`), the eval command's runner in the progress, the
verdict in the result and the audit log. What follows (the keep carried out, a revert, a
cancellation) is handed back to `advance`, which takes every move the same way.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from playbooks.engines.base import EngineError
from playbooks.experiments import steps
from playbooks.experiments.deps import Deps
from playbooks.gate.result import GateResult
from playbooks.quality.compare import QualityVerdict, compare_answers, judge_eval
from playbooks.quality.eval_process import poll_eval, start_eval
from storage import audit, quality_answers
from storage import experiments as store
from storage.experiments import State

UNANSWERED = "unanswered_since"  # progress: when the server first failed to answer a prompt


@dataclass(frozen=True)
class Taken:
    """What a quality step leaves to `advance`: a move to take, progress to record."""

    then: steps.Move | steps.Keep | None = None
    progress: dict[str, Any] = field(default_factory=dict)


def take(
    deps: Deps, row: store.ExperimentRow, view: steps.View, facts: steps.Facts,
    step: steps.QualityStep,
) -> Taken:  # fmt: skip
    if isinstance(step, steps.RecordAnswers):
        return _record_answers(deps, row, view, facts, step)
    if isinstance(step, steps.JudgeAnswers):
        return _judge_answers(deps, row, view)
    if isinstance(step, steps.StartEval):
        return _start_eval(deps, row, view)
    return _poll_eval(deps, row, view)


def _note(deps: Deps, row: store.ExperimentRow, text: str) -> None:
    audit.record(
        deps.db,
        audit.Note(
            actor="kvpilot", created=deps.now(), server=deps.server, experiment_id=row.id, text=text
        ),
    )


def _record_answers(
    deps: Deps, row: store.ExperimentRow, view: steps.View, facts: steps.Facts,
    step: steps.RecordAnswers,
) -> Taken:  # fmt: skip
    golden = None if view.quality is None else view.quality.golden
    assert golden is not None  # steps asks for answers only where there are golden prompts
    prompts = golden.prompts[step.start : step.stop]

    def ask(index: int) -> str:
        prompt = prompts[index]
        return deps.client.generate(
            prompt, max_tokens=golden.max_tokens, timeout_s=golden.timeout_s
        )

    try:
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            got = list(pool.map(ask, range(len(prompts))))
    except EngineError as exc:
        return _unanswered(deps, row, view, facts, step, exc)
    quality_answers.add_answers(deps.db, row.id, step.phase, step.start, got, now=deps.now())
    server = "the server before the change" if step.phase == "baseline" else "the changed server"
    text = (
        f"golden answers {step.start + 1}-{step.stop} of {len(golden.prompts)} recorded from "
        f"{server}"
    )
    _note(deps, row, text)
    deps.say(f"{row.state}: {text}")
    return Taken(progress={UNANSWERED: None} if view.progress.unanswered_since else {})


def _unanswered(
    deps: Deps, row: store.ExperimentRow, view: steps.View, facts: steps.Facts,
    step: steps.RecordAnswers, exc: EngineError,
) -> Taken:  # fmt: skip
    """A prompt was not answered: asked again at the next step, until the server has not
    answered for longer than a measurement may go unread."""
    since = view.progress.unanswered_since
    if since is None:
        deps.say(f"{row.state}: a golden prompt was not answered ({exc}); asking again")
        return Taken(progress={UNANSWERED: facts.now_ts})
    waited = facts.now_ts - float(since)
    if waited <= view.settings.gap_limit_s:
        deps.say(f"{row.state}: a golden prompt was not answered ({exc}); asking again")
        return Taken()
    if step.phase == "baseline":
        return Taken(
            steps.Move(
                State.cancelled,
                f"the server did not answer the golden prompts for {waited:.0f} s ({exc}); "
                "nothing was changed",
                {"cause": "died"},
            )
        )
    return Taken(
        steps.Move(
            State.reverting,
            f"the changed server did not answer the golden prompts for {waited:.0f} s: {exc}",
            {"cause": "died"},
        )
    )


def _judge_answers(deps: Deps, row: store.ExperimentRow, view: steps.View) -> Taken:
    golden = None if view.quality is None else view.quality.golden
    assert golden is not None
    verdict = compare_answers(
        quality_answers.answers(deps.db, row.id, "baseline"),
        quality_answers.answers(deps.db, row.id, "trial"),
        golden,
    )
    return _judged(deps, row, view, verdict)


def _start_eval(deps: Deps, row: store.ExperimentRow, view: steps.View) -> Taken:
    command = None if view.quality is None else view.quality.command
    assert command is not None
    run = start_eval(command, deps.client.base_url, row.id)
    _note(deps, row, f"{command.describe()} started against {deps.client.base_url}")
    deps.say(f"{row.state}: {command.describe()} started")
    return Taken(progress={"eval": run.to_json()})


def _poll_eval(deps: Deps, row: store.ExperimentRow, view: steps.View) -> Taken:
    command = None if view.quality is None else view.quality.command
    assert command is not None
    run = view.progress.eval
    assert run is not None  # (a started run leads here: `steps._checking_quality`)
    outcome = poll_eval(run)
    if outcome == "running":
        return Taken()
    if outcome == "vanished":
        text = (
            "the eval command's runner is gone without a result (its host restarted, or "
            "kvpilot resumed on another host): starting the command again"
        )
        _note(deps, row, text)
        deps.say(f"{row.state}: {text}")
        return Taken(progress={"eval": None})
    return _judged(deps, row, view, judge_eval(outcome, command))


def _judged(
    deps: Deps, row: store.ExperimentRow, view: steps.View, verdict: QualityVerdict
) -> Taken:
    """Store the verdict with the result and in the audit log; the keep or revert follows."""
    quality = {"passed": verdict.passed, "summary": verdict.summary, **verdict.evidence}
    result = replace(GateResult.from_json(row.result or {}), quality=quality)
    store.set_result(deps.db, row.id, result.to_json(), now=deps.now())
    audit.record(
        deps.db,
        audit.VerdictReached(
            actor="kvpilot", created=deps.now(), server=deps.server, experiment_id=row.id,
            verdict="quality_passed" if verdict.passed else "quality_failed",
            summary=verdict.summary, evidence=quality,
        ),
    )  # fmt: skip
    deps.say(
        f"{row.state}: answer quality {'held' if verdict.passed else 'failed'}: {verdict.summary}"
    )
    return Taken(steps.after_quality(view, verdict))
