"""A campaign's steps cut down to the GPUs' measured room or to an approved plan's arguments.

Steps cut down so a campaign can take them: to the GPUs' measured room, or to the
arguments an approved plan names.

`choose_next` (`policy`) asks these where the rules' own options are all passed over for room,
or for arguments outside the plan; each cut-down step is judged by the rules again, against the
same measurement (`Reassess`), never assumed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from playbooks.campaigns.room import MIN_CREDITED_CHUNK, GpuRoom
from playbooks.engines.types import Option

Reassess = Callable[[Sequence[dict[str, Any]]], Sequence[Option]]
FIT_STEP = 0.01  # memory fractions are tried this far apart, largest first
FIT_STEPS = 10  # and at most this many below the option's own


class Plan(Protocol):
    """An approved plan as the cut-down reads it (`policy.Allowance`)."""

    @property
    def ranges(self) -> Mapping[str, Any]: ...

    def refusal(self, change: Mapping[str, Any]) -> str | None: ...


def expected_gain(option: Option) -> float:
    """The middle of the predicted throughput change (0 when the rules predict none)."""
    if option.predicted_gain is None:
        return 0.0
    low, high = option.predicted_gain
    middle = (low + high) / 2
    return middle if math.isfinite(middle) else 0.0


def fitted(options: Sequence[Option], room: GpuRoom, reassess: Reassess) -> list[Option]:
    """Each option cut down to the largest memory fraction whose added GPU memory the room
    holds with its margin, as the rules judge it (none where no smaller fraction adds memory,
    fits and is predicted to help). The fraction is the option's one value between 0 and 1
    (SGLang's `mem_fraction_static`; vLLM's options do not say what they add per GPU, so the
    room is never what passes them over).

    Where the server showed what its prefill chunk takes (`room.chunk`, a kept step that shrank
    it), each option is also tried with half the chunk, from its own fraction down: the memory
    the smaller chunk frees may hold the larger pool. The rules judge the pair (the smaller
    chunk lowers their activation floor too); both cut-down options are returned and the
    campaign takes the one predicted to gain more.
    """
    out: list[Option] = []
    for option in options:
        fractions = [k for k, v in option.change.items() if isinstance(v, float) and 0 < v < 1]
        if len(fractions) != 1:
            continue
        key = fractions[0]
        top = option.change[key]
        smaller = _largest_fitting(
            [{**option.change, key: round(top - FIT_STEP * i, 2)} for i in range(1, FIT_STEPS + 1)],
            key, room, reassess,
        )  # fmt: skip
        if smaller is not None:
            out.append(smaller)
        credit = room.chunk
        if credit is None or credit.key in option.change:
            continue
        if credit.chunk // 2 < MIN_CREDITED_CHUNK:
            continue  # activations stop shrinking below it: nothing more to free
        halved = {**option.change, credit.key: credit.chunk // 2}
        traded = _largest_fitting(
            [{**halved, key: round(top - FIT_STEP * i, 2)} for i in range(FIT_STEPS + 1)],
            key, room, reassess,
        )  # fmt: skip
        if traded is not None:
            out.append(traded)
    return out


def within_plan(options: Sequence[Option], allowance: Plan, reassess: Reassess) -> list[Option]:
    """Each option the plan passes over only for arguments it does not name, cut down to the
    arguments it does: a larger pool the rules recommend together with a smaller prefill
    chunk, under a plan of fractions alone, becomes the largest fraction they still recommend
    at the chunk the server runs (as the rules judge it against the same measurement), if it
    is predicted to help. Anything past the rules' own margins stays passed over."""
    out: list[Option] = []
    for option in options:
        named = {k: v for k, v in option.change.items() if k in allowance.ranges}
        if not named or len(named) == len(option.change) or option.verdict == "unsafe":
            continue
        fractions = [k for k, v in named.items() if isinstance(v, float) and 0 < v < 1]
        key = fractions[0] if len(fractions) == 1 else None
        changes = (
            [named]
            if key is None
            else [{**named, key: round(named[key] - FIT_STEP * i, 2)} for i in range(FIT_STEPS + 1)]
        )
        ranked = sorted(reassess(changes), key=lambda o: -float(o.change.get(key or "", 0.0)))
        for judged in ranked:
            if judged.verdict == "recommended" and allowance.refusal(judged.change) is None:
                if expected_gain(judged) > 0:
                    out.append(judged)
                break
    return out


def _largest_fitting(
    changes: Sequence[dict[str, Any]], key: str, room: GpuRoom, reassess: Reassess
) -> Option | None:
    """The change with the largest `key` the rules judge to fit the room, if it is predicted
    to help (None otherwise)."""
    for judged in sorted(reassess(changes), key=lambda o: -o.change[key]):
        added = judged.static_gpu_gib
        if judged.verdict == "unsafe":
            continue  # past the rules' own edge at this chunk: a smaller fraction may not be
        if added is None or room.refusal(added, judged.change) is not None:
            continue  # adds nothing (at or below the fraction the server runs) or too much
        return judged if expected_gain(judged) > 0 else None
    return None
