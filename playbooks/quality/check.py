"""What an answer quality check is: golden prompts with a tolerance, or an eval command.

A change that can alter answers (an 8-bit KV cache) is kept only when an operator opted its
argument in (`lossy_ok`) and the check passes on the changed server. The check is built once
from configuration (`bot/app/config/quality.py`) and stored with each experiment it guards, so
a resumed experiment judges by the check it started with, not by a file edited since.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from playbooks.engines.base import Prompt

DEFAULT_MAX_TOKENS = 64
DEFAULT_ANSWER_TIMEOUT_S = 60.0  # one golden answer, queued behind the server's load
DEFAULT_COMMAND_TIMEOUT_S = 600.0  # the whole eval command
URL_VARIABLE = "KVPILOT_SERVER_URL"  # the eval command finds the changed server here


@dataclass(frozen=True)
class GoldenPrompts:
    """Prompts asked with greedy decoding before the change and after it; the answers are
    compared under the stated tolerance (at least one of the two minimums is set)."""

    prompts: tuple[Prompt, ...]
    source: str  # the file they were read from, for people
    max_tokens: int = DEFAULT_MAX_TOKENS
    min_exact_match: float | None = None  # share of answers identical to the baseline's
    min_token_overlap: float | None = None  # mean word overlap (F1) with the baseline's
    timeout_s: float = DEFAULT_ANSWER_TIMEOUT_S  # one answer

    def describe(self) -> str:
        limits = []
        if self.min_exact_match is not None:
            limits.append(f"at least {self.min_exact_match:.0%} of answers identical")
        if self.min_token_overlap is not None:
            limits.append(f"mean word overlap at least {self.min_token_overlap:.2f}")
        return f"{len(self.prompts)} golden prompts from {self.source} ({' and '.join(limits)})"


@dataclass(frozen=True)
class EvalCommand:
    """A command run against the changed server (its URL in `URL_VARIABLE`); exit status 0
    passes. An argument list, never a shell string."""

    command: tuple[str, ...]
    cwd: str  # the configuration's directory: relative paths in the command start there
    timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S

    def describe(self) -> str:
        argv = " ".join(self.command)
        return f"the eval command `{argv}` (exit status 0 within {self.timeout_s:g} s)"


@dataclass(frozen=True)
class QualityCheck:
    """The check a server's lossy changes must pass, and which arguments the operator opted in."""

    lossy_ok: tuple[str, ...]  # argument names whose changes may be kept once the check passes
    check: GoldenPrompts | EvalCommand

    @property
    def golden(self) -> GoldenPrompts | None:
        return self.check if isinstance(self.check, GoldenPrompts) else None

    @property
    def command(self) -> EvalCommand | None:
        return self.check if isinstance(self.check, EvalCommand) else None

    def applies_to(self, change: Mapping[str, Any]) -> bool:
        """Whether `change` touches an opted-in argument (whichever way it moves it)."""
        return any(name in self.lossy_ok for name in change)

    def describe(self) -> str:
        return self.check.describe()

    def to_json(self) -> dict[str, Any]:
        """The stored form, kept in the experiment's settings under `quality`."""
        out: dict[str, Any] = {"lossy_ok": list(self.lossy_ok)}
        if isinstance(self.check, GoldenPrompts):
            g = self.check
            out["golden"] = {
                "prompts": [_prompt_json(p) for p in g.prompts],
                "source": g.source,
                "max_tokens": g.max_tokens,
                "min_exact_match": g.min_exact_match,
                "min_token_overlap": g.min_token_overlap,
                "timeout_s": g.timeout_s,
            }
        else:
            c = self.check
            out["command"] = {"argv": list(c.command), "cwd": c.cwd, "timeout_s": c.timeout_s}
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> QualityCheck:
        lossy_ok = tuple(str(name) for name in data.get("lossy_ok", []))
        golden = data.get("golden")
        if isinstance(golden, Mapping):
            return cls(
                lossy_ok,
                GoldenPrompts(
                    prompts=tuple(_prompt_of(p) for p in golden["prompts"]),
                    source=str(golden["source"]),
                    max_tokens=int(golden["max_tokens"]),
                    min_exact_match=_optional(golden.get("min_exact_match")),
                    min_token_overlap=_optional(golden.get("min_token_overlap")),
                    timeout_s=float(golden["timeout_s"]),
                ),
            )
        command = data["command"]
        return cls(
            lossy_ok,
            EvalCommand(
                command=tuple(str(a) for a in command["argv"]),
                cwd=str(command["cwd"]),
                timeout_s=float(command["timeout_s"]),
            ),
        )


def stored_check(settings: Mapping[str, Any]) -> QualityCheck | None:
    """The check an experiment carries in its settings; None when it guards nothing."""
    data = settings.get("quality")
    return QualityCheck.from_json(data) if isinstance(data, Mapping) else None


def _prompt_json(prompt: Prompt) -> dict[str, Any]:
    if prompt.text is not None:
        return {"prompt": prompt.text}
    return {"messages": [{"role": r, "content": c} for r, c in prompt.messages]}


def _prompt_of(data: Mapping[str, Any]) -> Prompt:
    if "prompt" in data:
        return Prompt(text=str(data["prompt"]))
    return Prompt(messages=tuple((str(m["role"]), str(m["content"])) for m in data["messages"]))


def _optional(value: Any) -> float | None:
    return None if value is None else float(value)
