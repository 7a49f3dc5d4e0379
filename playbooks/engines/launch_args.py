"""Launch-argument machinery every engine shares: typed values, allow-list entries, argument lists.

An engine's allow-list (`sglang/allow_list.py`, `vllm/allow_list.py`) says which flags kvpilot
may edit and with which type and range, citing the engine's own parser; what a typed value *is*
(an int spelt as digits, a float spelt as Python's shortest repr, a choice, an on/off flag), how
an operator's `KEY=VALUE` finds its entry (`AllowList`) and how an entry is found in or removed
from an argument list is the same for every argparse-based server, so it lives here once. Values
are checked twice: when an operator's text is parsed, and again when a stored or computed value
is spelt onto a command line, so no path bypasses the ranges.

What an argument comes to (`read`) is shared too: its last spelling in a list read as the
engine's parser reads it, typed, and, where the flag is absent, the engine's own default when
that is a constant (each engine lists its `Default`s, citing its source).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from playbooks.engines.base import ArgError, ArgReading


@dataclass(frozen=True)
class IntValue:
    """A `type=int` flag: held as int, spelt as digits."""

    lo: int
    hi: int
    allow: tuple[int, ...] = ()  # accepted below `lo` (-1 = off)
    unit: str = ""
    power_of_two: bool = False

    def check(self, raw: object) -> int:
        """The value as an int; integral floats (40.0 from JSON or arithmetic) are accepted."""
        if isinstance(raw, bool):
            raise ArgError(f"expected a whole number{self._of()}, got {raw}")
        if isinstance(raw, str):
            return self.parse(raw)
        if isinstance(raw, float):
            if not math.isfinite(raw) or not raw.is_integer():
                raise ArgError(f"must be a whole number{self._of()}, got {raw:g}")
            raw = int(raw)
        if not isinstance(raw, int):
            raise ArgError(f"expected a whole number{self._of()}, got {raw!r}")
        if raw in self.allow:
            return raw
        if raw < self.lo:
            extra = f" (or {', '.join(map(str, self.allow))})" if self.allow else ""
            raise ArgError(f"must be at least {self.lo}{extra}, got {raw}")
        if raw > self.hi:
            raise ArgError(f"must be at most {self.hi}, got {raw}")
        if self.power_of_two and raw & (raw - 1):
            raise ArgError(f"must be a power of two (1, 2, 4, ... {self.hi}), got {raw}")
        return raw

    def parse(self, text: str) -> int:
        text = text.strip()
        number: int | float
        try:
            number = int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                raise ArgError(f"expected a whole number{self._of()}, got {text!r}") from None
        return self.check(number)

    def spell(self, value: int) -> str:
        return str(value)

    def _of(self) -> str:
        return f" of {self.unit}" if self.unit else ""


@dataclass(frozen=True)
class FloatValue:
    """A `type=float` flag: held as a finite float, spelt as Python's shortest repr."""

    lo: float
    hi: float
    lo_open: bool = True
    hi_open: bool = True

    def check(self, raw: object) -> float:
        if isinstance(raw, str):
            return self.parse(raw)
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise ArgError(f"expected a number, got {raw!r}")
        value = float(raw)
        below = value <= self.lo if self.lo_open else value < self.lo
        above = value >= self.hi if self.hi_open else value > self.hi
        if not math.isfinite(value) or below or above:
            lo_b = "(" if self.lo_open else "["
            hi_b = ")" if self.hi_open else "]"
            raise ArgError(f"must be in {lo_b}{self.lo:g}, {self.hi:g}{hi_b}, got {raw}")
        return value

    def parse(self, text: str) -> float:
        try:
            number = float(text)
        except ValueError:
            raise ArgError(f"expected a number, got {text!r}") from None
        return self.check(number)

    def spell(self, value: float) -> str:
        return repr(value)


@dataclass(frozen=True)
class ChoiceValue:
    """A `choices=[...]` flag: one of the listed words, spelt as is."""

    options: tuple[str, ...]

    def check(self, raw: object) -> str:
        if not isinstance(raw, str) or raw not in self.options:
            raise ArgError(f"must be one of {', '.join(self.options)}, got {raw!r}")
        return raw

    def parse(self, text: str) -> str:
        return self.check(text.strip())

    def spell(self, value: str) -> str:
        return value


@dataclass(frozen=True)
class BoolValue:
    """An on/off flag. `store_true` (SGLang's): on is the bare flag, off is its absence.
    `negatable` (argparse's `BooleanOptionalAction`, vLLM's): off is spelt `--no-FLAG`, since
    the engine's own default may be on."""

    negatable: bool = False

    def check(self, raw: object) -> bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str):
            return self.parse(raw)
        raise ArgError(f"expected true or false, got {raw!r}")

    def parse(self, text: str) -> bool:
        lowered = text.strip().lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise ArgError(f"expected true or false, got {text!r}")

    def spell(self, value: bool) -> str:
        raise AssertionError("an on/off flag has no value to spell")


Value = IntValue | FloatValue | ChoiceValue | BoolValue


@dataclass(frozen=True)
class ArgSpec:
    """One allow-list entry: the argument's name (argparse's `dest`), its value type, what it is
    for help texts, and other spellings the engine's parser accepts for the same flag."""

    name: str
    value: Value
    meaning: str
    aliases: tuple[str, ...] = ()  # other flags with the same dest (`--device-memory-utilization`)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def negated(self) -> str | None:
        """The off spelling of a negatable on/off flag."""
        if isinstance(self.value, BoolValue) and self.value.negatable:
            return "--no-" + self.flag[2:]
        return None

    @property
    def takes_value(self) -> bool:
        return not isinstance(self.value, BoolValue)

    @property
    def spellings(self) -> tuple[str, ...]:
        """Every flag that sets this argument (aliases, the off spelling)."""
        negated = (self.negated,) if self.negated else ()
        return (self.flag, *self.aliases, *negated)

    def parse(self, text: str) -> Any:
        """Operator text to the value the engine's type gives (raises ArgError naming the key)."""
        try:
            return self.value.parse(text)
        except ArgError as exc:
            raise ArgError(f"{self.name}: {exc}") from None

    def check(self, raw: object) -> Any:
        """Any value (parsed, stored as JSON, computed) to its checked, canonical form."""
        try:
            return self.value.check(raw)
        except ArgError as exc:
            raise ArgError(f"{self.name}: {exc}") from None

    def cli(self, raw: object) -> list[str]:
        """The command-line tokens for the value: `[flag, text]`, `[flag]`, `[--no-flag]` or
        `[]` (a store_true flag off)."""
        value = self.check(raw)
        if isinstance(self.value, BoolValue):
            if value:
                return [self.flag]
            return [self.negated] if self.negated else []
        return [self.flag, self.value.spell(value)]


def normalise_key(key: str) -> str:
    return key.strip().lstrip("-").replace("-", "_")


def split_assignment(text: str, example: str) -> tuple[str, str]:
    """`KEY=VALUE` into its halves (raises ArgError showing `example`)."""
    key, eq, value = text.partition("=")
    if not eq or not key.strip() or not value.strip():
        raise ArgError(f"{text!r} is not KEY=VALUE (for example {example})")
    return key, value


@dataclass(frozen=True)
class AllowList:
    """An engine's allow-list entries by name, and how an operator's `KEY=VALUE` items find them:
    the refusal of an unknown key and of a key given twice are the same for every engine.

    `what` names an argument in a refusal ("a vLLM argument"); `example` is the item shown for
    text that is not `KEY=VALUE`; with `by_alias` a key may also be an alias's name, as vLLM's
    parser reads `device_memory_utilization` for `gpu_memory_utilization`.
    """

    entries: Mapping[str, ArgSpec]
    what: str
    example: str
    by_alias: bool = False

    @functools.cached_property
    def aliases(self) -> dict[str, str]:
        """An alias's name -> the entry it sets (none without `by_alias`)."""
        if not self.by_alias:
            return {}
        return {normalise_key(a): name for name, spec in self.entries.items() for a in spec.aliases}

    def find(self, key: str) -> ArgSpec | None:
        name = normalise_key(key)
        return self.entries.get(self.aliases.get(name, name))

    def spec_of(self, key: str) -> ArgSpec:
        spec = self.find(key)
        if spec is None:
            name, known = normalise_key(key), ", ".join(sorted(self.entries))
            raise ArgError(f"{name!r} is not {self.what} kvpilot can change; known: {known}")
        return spec

    def parse_assignment(self, text: str) -> tuple[str, Any]:
        """One `KEY=VALUE` item (`--flag-name=value` too) as the entry's name and typed value."""
        key, value = split_assignment(text, self.example)
        spec = self.spec_of(key)
        return spec.name, spec.parse(value)

    def parse_items(self, items: Sequence[str]) -> dict[str, Any]:
        """Items as one change; a key given twice must say the same both times. The engine's
        checks across arguments come after."""
        change: dict[str, Any] = {}
        for item in items:
            name, value = self.parse_assignment(item)
            if name in change and change[name] != value:
                raise ArgError(f"{name} is given twice with different values")
            change[name] = value
        return change


def _names(flags: Sequence[str], underscores: bool) -> set[str]:
    names = set(flags)
    if underscores:  # `--max_num_seqs` for `--max-num-seqs`, as a flexible parser reads them
        names |= {"--" + f[2:].replace("-", "_") for f in flags if f.startswith("--")}
    return names


def without(
    args: Sequence[str],
    flags: Sequence[str],
    *,
    takes_value: bool | None = None,
    underscores: bool = False,
) -> list[str]:
    """`args` without any of `flags`, as `--flag value`, `--flag=value` or a bare `--flag`.

    `takes_value=None` guesses: the next token is the flag's value unless it starts with `--`;
    an engine that knows the flag is on/off passes False, so a positional after it stays.
    """
    names = _names(flags, underscores)
    out: list[str] = []
    i = 0
    while i < len(args):
        tok = args[i]
        if tok in names:
            has_next = i + 1 < len(args) and not args[i + 1].startswith("--")
            if has_next and takes_value is not False:
                i += 1  # skip the flag's value too
        elif not any(tok.startswith(name + "=") for name in names):
            out.append(tok)
        i += 1
    return out


def value_of(args: Sequence[str], flags: Sequence[str], *, underscores: bool = False) -> str | None:
    """The last value any of `flags` is given in an argument list ("true" for a bare flag), as
    argparse reads it: a later occurrence wins."""
    names = _names(flags, underscores)
    found: str | None = None
    for i, tok in enumerate(args):
        if tok in names:
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                found = args[i + 1]
            else:
                found = "true"
        else:
            for name in names:
                if tok.startswith(name + "="):
                    found = tok.split("=", 1)[1]
    return found


# ----------------------------------------------------------------------------- readings
@dataclass(frozen=True)
class Default:
    """What an engine runs when a flag is absent: a constant of its own (`known`), `source`
    citing where the engine sets it; or a value it works out at start-up (`known=False`),
    `source` saying from what."""

    source: str
    value: Any = None
    known: bool = True


def decided_at_start(source: str) -> Default:
    """A default kvpilot cannot know: the engine picks it at start-up (from the GPU, the model)."""
    return Default(source, known=False)


def when_absent(
    constants: Mapping[str, Default], at_start: Mapping[str, str], engine: str
) -> Callable[[str], Default]:
    """What an engine runs for an absent flag, by name: one of its `constants`, or a value it
    works out at start-up (`at_start` says from what; any flag not listed is taken so)."""

    def default(name: str) -> Default:
        if name in constants:
            return constants[name]
        return decided_at_start(at_start.get(name, f"{engine} decides it at start-up"))

    return default


def last_given(
    args: Sequence[str], spec: ArgSpec, *, underscores: bool = False
) -> tuple[str, str] | None:
    """(how it is written, its value as text) for the last spelling of `spec` in an argument
    list, as argparse reads it (a later one wins): `--flag value`, `--flag=value`, a bare on/off
    flag ("true"), its `--no-` form ("false"); None where it is absent. A flag that takes a value
    but is given none reads as "" (which no type parses)."""
    names = _names(spec.spellings, underscores)
    negated = _names((spec.negated,), underscores) if spec.negated else set()
    found: tuple[str, str] | None = None
    for i, tok in enumerate(args):
        flag, eq, inline = tok.partition("=")
        if eq and flag in names:
            found = (tok, inline)
        elif tok in names and not spec.takes_value:
            found = (tok, "false" if tok in negated else "true")
        elif tok in names:
            has_value = i + 1 < len(args) and not args[i + 1].startswith("--")
            found = (f"{tok} {args[i + 1]}", args[i + 1]) if has_value else (tok, "")
    return found


def read(
    spec: ArgSpec,
    args: Sequence[str],
    default: Default,
    *,
    underscores: bool = False,
    synonyms: Mapping[Any, Any] | None = None,
) -> ArgReading:
    """`spec` as the engine would run it from `args` (`base.ArgReading`): the value typed as
    the engine's parser types it (`0.850` is 0.85, `--x=v` is `--x v`), a synonym in its one
    spelling; absent, `default`."""
    given = last_given(args, spec, underscores=underscores)
    if given is None:
        if not default.known:
            return ArgReading(spec.name, spec.flag, "unknown", source=default.source)
        return ArgReading(spec.name, spec.flag, "default", default.value, source=default.source)
    spelt, text = given
    try:
        value = spec.parse(text)
    except ArgError as exc:
        why = f"kvpilot cannot read `{spelt}` ({exc})"
        return ArgReading(spec.name, spec.flag, "unknown", spelt=spelt, source=why)
    value = (synonyms or {}).get(value, value)
    return ArgReading(spec.name, spec.flag, "set", value, spelt=spelt)
