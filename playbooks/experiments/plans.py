"""What a proposal asks a person to approve: one experiment, a campaign, or a rollout's step.

A proposal stores its plan as JSON and an approval is bound to that JSON's hash
(`storage.proposals`), so `to_json` writes exactly the keys each front end stored before the
plans had types, and a plan is built once, where it is proposed. The three shapes are told
apart by the key that only one of them has (`campaign`, `rollout`); `plan_from_json` is the
one place that looks, so readers branch on the type instead of on keys, and a stored plan of
no known shape is refused there, by name, instead of failing later on a missing key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from playbooks.campaigns.policy import Allowance


class UnknownPlan(ValueError):
    """A stored plan of none of the shapes kvpilot proposes."""


@dataclass(frozen=True, kw_only=True)
class _Restart:
    """What every plan approves: a restart of `server` from one argument list to another,
    judged by a gate with these settings (`GateSettings` fields, as approved)."""

    server: str
    from_args: tuple[str, ...]
    to_args: tuple[str, ...]
    gate: Mapping[str, Any]
    verdict: str | None = None  # the rules' verdict on the change (None: not stored)

    def to_json(self) -> dict[str, Any]:
        """The plan as stored (its hash is over canonical JSON: the keys' order is not kept);
        a part that is None was never stored and stays absent."""
        out = {
            "server": self.server,
            "from_args": list(self.from_args),
            "to_args": list(self.to_args),
            "gate": dict(self.gate),
            "verdict": self.verdict,
            **self._own(),
        }
        return {k: v for k, v in out.items() if v is not None}

    def _own(self) -> Mapping[str, object]:
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class ExperimentPlan(_Restart):
    """One gated change, proposed in chat or the terminal."""

    change: Mapping[str, Any]
    option: Mapping[str, Any] | None = None  # the rules' option (`Option.to_json`)

    def _own(self) -> Mapping[str, object]:
        return {"change": dict(self.change), "option": _copy(self.option)}


@dataclass(frozen=True, kw_only=True)
class CampaignPlan(_Restart):
    """A bounded campaign approved once: the server's arguments now (no change of its own)
    and what the approval allows its steps (`Allowance`)."""

    campaign: Allowance
    option: Mapping[str, Any] | None = None  # its title, as the approval message shows it

    def _own(self) -> Mapping[str, object]:
        return {"campaign": self.campaign.to_json(), "option": _copy(self.option)}


@dataclass(frozen=True)
class RolloutRef:
    """The approved rollout a step's plan derives from."""

    id: int
    plan_hash: str
    approved_by: str


@dataclass(frozen=True, kw_only=True)
class RolloutPlan(_Restart):
    """One server's step of a rollout across its group, approved with the rollout."""

    change: Mapping[str, Any]
    rollout: RolloutRef

    @property
    def option(self) -> Mapping[str, Any] | None:
        """A step carries no option of its own (the rollout's source experiment had it)."""
        return None

    def _own(self) -> Mapping[str, object]:
        r = self.rollout
        ref = {"id": r.id, "plan_hash": r.plan_hash, "approved_by": r.approved_by}
        return {"change": dict(self.change), "rollout": ref}


def _copy(part: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if part is None else dict(part)


ProposalPlan = ExperimentPlan | CampaignPlan | RolloutPlan


def plan_from_json(data: Mapping[str, Any]) -> ProposalPlan:
    """The stored plan, typed by its shape; `UnknownPlan` for a shape kvpilot never stored."""
    missing = [k for k in ("from_args", "to_args", "gate") if k not in data]
    if missing or ("campaign" in data and "rollout" in data):
        raise UnknownPlan(
            "not a plan kvpilot proposes (an experiment, a campaign or a rollout's step): "
            + (
                f"it lacks {', '.join(missing)}"
                if missing
                else "it names both a campaign and a rollout"
            )
            + f"; its keys are {', '.join(sorted(data)) or 'none'}"
        )
    common: dict[str, Any] = {
        "server": str(data.get("server", "")),
        "from_args": _args(data["from_args"]),
        "to_args": _args(data["to_args"]),
        "gate": dict(data["gate"]),
        "verdict": None if data.get("verdict") is None else str(data["verdict"]),
    }
    option = data.get("option")
    option = dict(option) if isinstance(option, Mapping) else None
    if "campaign" in data:
        return CampaignPlan(**common, campaign=Allowance.from_json(data["campaign"]), option=option)
    if "rollout" in data:
        r = data["rollout"]
        ref = RolloutRef(int(r["id"]), str(r["plan_hash"]), str(r["approved_by"]))
        return RolloutPlan(**common, change=dict(data.get("change") or {}), rollout=ref)
    return ExperimentPlan(**common, change=dict(data.get("change") or {}), option=option)


def _args(value: Sequence[Any]) -> tuple[str, ...]:
    return tuple(str(a) for a in value)
