"""Prometheus text exposition read at a fleet's rate: only the engine's families, exactly.

`prometheus_client`'s parser costs about 15 ms of CPU for SGLang's 91 KB `/metrics` (685
lines) and 8 ms for vLLM's 51 KB; a bot sampling 500 servers every 15 s spent 40% of a core on
it alone. kvpilot keeps only the engine's own families (their name prefix) and, of the
histograms' bucket series, only the latency ones the gate and diagnose read
(`MetricsSpec.histograms`, the same set the Prometheus source asks for), so this reader skips
every other line after reading its name, and reads the kept ones with two regular expressions.

It reproduces `prometheus_client.parser.text_string_to_metric_families` for what it keeps
(held to it by tests over every recorded `/metrics`): the same family names (a counter's
`_total` dropped, a counter sample without `_total` renamed to have one, a sample outside its
family's names starting an untyped family of its own), the same label values (escapes undone)
and the same numbers (an integer stays an `int`). Where a line is anything but the common shape
(a quoted metric or label name, the name inside the braces, a reserved `__` label, a comment
naming no metric, an unknown type, a malformed sample), `read` answers None and the caller
parses the whole text with
`prometheus_client`, which reads what it can and raises where the text is not exposition at
all; a malformed line of a family that is skipped is not looked at past its name.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*(?:,|$)')
_ESCAPE = re.compile(r'\\[\\n"]')
_UNESCAPED = {"\\\\": "\\", "\\n": "\n", '\\"': '"'}
_SUFFIXES = {
    "counter": ("",),
    "gauge": ("",),
    "summary": ("_count", "_sum", ""),
    "histogram": ("_count", "_sum", "_bucket"),
}
# prometheus_client.metrics_core.METRIC_TYPES, with `untyped` (which it reads as `unknown`)
_TYPES = frozenset(
    {"counter", "gauge", "summary", "histogram", "gaugehistogram", "unknown", "info", "stateset"}
)

Sample = tuple[str, dict[str, str], float]


@dataclass
class Reading:
    """The kept samples (name, labels, value) and the names of the families they came from."""

    samples: list[Sample]
    families: set[str]


class _Unusual(Exception):
    """A line this reader leaves to `prometheus_client`."""


class _Families:
    """`prometheus_client`'s family bookkeeping: which sample names the current family owns,
    and the name each family is known by (a counter's without `_total`)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.name = ""
        self.type = "untyped"
        self.allowed: tuple[str, ...] = ()
        self.current: list[Sample] = []
        self.reading = Reading([], set())

    def close(self) -> None:
        """The current family ends: keep its samples when it is the engine's."""
        if self.name:
            self._keep(self.name, self.type, self.current)
        self.name, self.type, self.allowed, self.current = "", "untyped", (), []

    def _keep(self, name: str, typ: str, samples: list[Sample]) -> None:
        if not name.startswith(self.prefix):
            return
        if typ == "counter":
            if name.endswith("_total"):
                name = name[:-6]
            else:
                samples = [(s[0] + "_total", s[1], s[2]) for s in samples]
        self.reading.families.add(name)
        self.reading.samples.extend(samples)

    def comment(self, line: str) -> None:
        parts = line.split(None, 3)
        if len(parts) < 2 or parts[1] not in ("HELP", "TYPE"):
            return  # a comment (prometheus_client ignores `#` lines that are neither)
        if len(parts) < 3 or parts[2].startswith('"') or not _NAME.fullmatch(parts[2]):
            raise _Unusual(line)
        name = parts[2]
        if parts[1] == "HELP":
            if name != self.name:
                self.close()
                self.name, self.allowed = name, (name,)
            return
        if len(parts) < 4 or (parts[3] not in _TYPES and parts[3] != "untyped"):
            raise _Unusual(line)
        if name != self.name:
            self.close()
            self.name = name
        self.type = parts[3]
        self.allowed = tuple(name + s for s in _SUFFIXES.get(self.type, ("",)))

    def sample(self, name: str, sample: Sample | None) -> None:
        """A sample line named `name`; `sample` None where it is not kept (read no further)."""
        if name in self.allowed:
            if sample is not None:
                self.current.append(sample)
            return
        self.close()  # a sample outside its family: an untyped family of its own
        if sample is not None:
            self._keep(name, "untyped", [sample])


def read(text: str, prefix: str, buckets: Collection[str]) -> Reading | None:
    """The samples of families named `prefix...` (of their `_bucket` series only `buckets`),
    or None where the text has a line only `prometheus_client` should judge."""
    families = _Families(prefix)
    try:
        for raw in text.split("\n"):
            line = raw.strip()
            if not line:
                continue
            if line[0] == "#":
                families.comment(line)
                continue
            name = _name_of(line)
            kept = name.startswith(prefix) and (not name.endswith("_bucket") or name in buckets)
            families.sample(name, _sample(line, name) if kept else None)
        families.close()
    except _Unusual:
        return None
    return families.reading


def _name_of(line: str) -> str:
    match = _NAME.match(line)
    end = match.end() if match else 0
    if not end or end == len(line) or line[end] not in "{ \t":
        raise _Unusual(line)
    return line[:end]


def _sample(line: str, name: str) -> Sample:
    rest = line[len(name) :]
    labels: dict[str, str] = {}
    if rest[0] == "{":
        close = rest.rfind("}")  # nothing after the labels holds a brace
        if close < 0:
            raise _Unusual(line)
        labels = _labels(rest[1:close], line)
        rest = rest[close + 1 :]
    values = rest.split()
    if not values or "_" in values[0]:
        raise _Unusual(line)
    try:
        value: float = int(values[0])
    except ValueError:
        try:
            value = float(values[0])
        except ValueError:
            raise _Unusual(line) from None
    return (name, labels, value)


def _labels(text: str, line: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    pos, end = 0, len(text.rstrip())
    while pos < end:
        match = _LABEL.match(text, pos)
        if match is None or match.group(1) in labels or match.group(1).startswith("__"):
            raise _Unusual(line)
        value = match.group(2)
        labels[match.group(1)] = _ESCAPE.sub(_unescape, value) if "\\" in value else value
        pos = match.end()
    return labels


def _unescape(match: re.Match[str]) -> str:
    return _UNESCAPED[match.group(0)]
