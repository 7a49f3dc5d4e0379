"""A change that changes nothing: refused before anything is proposed, approved or restarted.

Restarting a server into the arguments it already runs costs two outages (the trial's restart
and the revert's) and measures nothing. Whether a change is one such is decided here, once, for
every path: `trial_args` is how the command line, chat proposals, approvals, campaigns and
rollouts turn "the arguments now" and a change into the arguments to restart with, and
`lifecycle.create` asks it again before an experiment is recorded.

"Nothing" is judged on what the engine would run, not on the text (the engine's `read_arg`):
a float flag's `0.850` is 0.85, `--x=v` is `--x v`, an alias is its flag, an on/off flag that
is absent is off, and an absent flag is the engine's own default where that default is a
constant (cited in the engine's `allow_list.py`). Where the engine works the value out at
start-up (SGLang's `mem_fraction_static` from the GPU's memory, vLLM's `max_num_seqs`), an
absent flag equals no value: setting it is a real change, since the server may run another.

The decision (`nothing_changes`) is a pure function over `ChangeFacts`; `facts_of` reads them
from the engine, which parses and looks up, nothing more.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from playbooks.engines.base import ArgError, ArgReading, Engine


class NothingToChange(ArgError):
    """The change would leave the server running what it runs; the message says why."""


@dataclass(frozen=True)
class ChangeFacts:
    """What a change does to one server's launch arguments, argument by argument.

    `before` and `after` hold, for each changed argument, what the engine would run from the
    arguments now and from those after the change; `rest_same` says whether every other
    argument stays as it is; `where` says where the arguments now were read from."""

    server: str
    engine: str  # how people write it (SGLang), for its defaults
    before: tuple[ArgReading, ...]
    after: tuple[ArgReading, ...]
    rest_same: bool
    where: str


def nothing_changes(facts: ChangeFacts) -> str | None:
    """Why the change would change nothing, for people; None when it changes something.

    Nothing changes when every other argument stays, and each changed argument is known before
    and after (set, or absent with a constant default) and has the same value both times."""
    if not facts.rest_same or not facts.before:
        return None
    for before, after in zip(facts.before, facts.after, strict=True):
        if not (before.known and after.known) or not _same(before.value, after.value):
            return None
    already = "; ".join(_already(r, facts.where, facts.engine) for r in facts.before)
    return f"nothing would change on `{facts.server}`: {already}"


def _same(a: Any, b: Any) -> bool:
    """Equal as the engine's types hold them (True is not 1: an on/off flag is no count)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


def _already(reading: ArgReading, where: str, engine: str) -> str:
    value = _shown(reading.value)
    if reading.origin == "set":
        return f"{reading.name} is already {value} (`{reading.spelt}` in {where})"
    return (
        f"{reading.name} is already {value} (no `{reading.flag}` in {where}, and "
        f"{engine}'s default is {value}: {reading.source})"
    )


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return "unset" if value is None else str(value)


def facts_of(
    engine: Engine,
    server: str,
    current: Sequence[str],
    trial: Sequence[str],
    change: Mapping[str, Any],
    where: str,
) -> ChangeFacts:
    """The facts of `change` taking `current` to `trial`, read by the engine."""
    names = [engine.read_arg(current, key).name for key in change]
    cleared = dict.fromkeys(names)  # None: every spelling of the changed arguments taken out
    rest_same = engine.with_change(current, cleared) == engine.with_change(trial, cleared)
    return ChangeFacts(
        server=server,
        engine=engine.label,
        before=tuple(engine.read_arg(current, name) for name in names),
        after=tuple(engine.read_arg(trial, name) for name in names),
        rest_same=rest_same,
        where=where,
    )


def trial_args(
    engine: Engine, server: str, current: Sequence[str], change: Mapping[str, Any], where: str
) -> list[str]:
    """`current` with `change` applied: the arguments to restart with. Raises
    `NothingToChange` when that changes nothing (and ArgError for a change not allowed)."""
    trial = engine.with_change(current, change)
    why = nothing_changes(facts_of(engine, server, current, trial, change, where))
    if why is not None:
        raise NothingToChange(why)
    return trial


def unchanged_by(
    engine: Engine, server: str, current: Sequence[str], where: str
) -> Callable[[Mapping[str, Any]], str | None]:
    """For choosing among changes (a campaign's next step, a rollout's servers): why a change
    would change nothing on the server running `current` (None: it changes something, or the
    engine cannot apply it, which its own checks then say)."""

    def why(change: Mapping[str, Any]) -> str | None:
        try:
            trial = engine.with_change(current, change)
            return nothing_changes(facts_of(engine, server, current, trial, change, where))
        except ArgError:
            return None

    return why


def launcher_words(kind: str) -> str:
    """Where the server's arguments were read from, for the refusal's text."""
    return f"its launch arguments as its {kind} launcher reports them"
