"""kvpilot.toml, mutated: every key given wrong types, out-of-range and unknown values.

Property: reading the file gives a Config or a ConfigError whose message names what was wrong;
never another exception (a traceback is not an error message). Mutations start from the two
shipped examples, so every key they use is reached.
"""

from __future__ import annotations

import copy
import datetime as dt
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from bot.app.config.loading import load, parse
from bot.app.config.values import ConfigError
from tests.fuzz.conftest import scaled, tally

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"
BASES = [tomllib.loads(p.read_text()) for p in sorted(EXAMPLES.glob("*.toml"))]
PATH = Path("/etc/kvpilot/kvpilot.toml")

Key = str | int


def leaves(node: Any, at: tuple[Key, ...] = ()) -> list[tuple[Key, ...]]:
    """Every path to a value (tables and arrays included) under `node`."""
    found: list[tuple[Key, ...]] = [at] if at else []
    if isinstance(node, dict):
        for k, v in node.items():
            found += leaves(v, (*at, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found += leaves(v, (*at, i))
    return found


PATHS = [(i, p) for i, base in enumerate(BASES) for p in leaves(base)]


def get(node: Any, path: tuple[Key, ...]) -> Any:
    for k in path:
        node = node[k]
    return node


TABLES = [(i, p) for i, p in [(i, ()) for i in range(len(BASES))] + PATHS
          if isinstance(get(BASES[i], p), dict)]  # fmt: skip

SCALARS = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([0, -1, 1, 10**12]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-300, 1e300, float("nan"), float("inf"), -float("inf")]),
    st.text(max_size=40),
    st.sampled_from(
        [
            "",
            " ",
            "0",
            "-5",
            "1e9",
            "30x",
            "30m",
            "99999999d",
            "U1",
            "c0abc",
            "\x00",
            "é" * 300,
            "http://",
            "ftp://h",
            "http://[::1",
            "; rm -rf /",
            "$(reboot)",
            "../../etc/passwd",
            "* * * *",
            "61 25 * * *",
            "Mars/Olympus",
        ]
    ),
    st.datetimes(timezones=st.none() | st.just(dt.UTC)),
    st.dates(),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=8,
)


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    """One example with one to three mutations: a value replaced, a key dropped or added."""
    i = draw(st.integers(0, len(BASES) - 1))
    data = copy.deepcopy(BASES[i])
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["replace", "replace", "drop", "add"]))
        if op == "add":
            _, table = draw(st.sampled_from([t for t in TABLES if t[0] == i]))
            target = get(data, table) if _reachable(data, table) else data
            if isinstance(target, dict):
                target[draw(st.text(min_size=1, max_size=16))] = draw(VALUES)
            continue
        paths = [p for j, p in PATHS if j == i and _reachable(data, p)]
        if not paths:
            continue
        path = draw(st.sampled_from(paths))
        parent = get(data, path[:-1])
        if op == "drop":
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(VALUES)
    return data


def _reachable(data: Any, path: tuple[Key, ...]) -> bool:
    """Whether `path` still names a value inside tables and arrays (an earlier mutation may
    have replaced a table on the way with a string, which indexes but cannot be assigned to)."""
    node = data
    for key in path:
        if not isinstance(node, (dict, list)):
            return False
        try:
            node = node[key]  # type: ignore[index]
        except (KeyError, IndexError, TypeError):
            return False
    return True


@settings(max_examples=scaled(150, 60_000))
@given(mutated())
def test_a_mutated_configuration_is_read_or_refused_with_a_message(data: dict[str, Any]) -> None:
    tally("kvpilot.toml: mutated tables")
    try:
        parse(data, PATH)
    except ConfigError as exc:
        assert str(exc).strip(), "a ConfigError without a message"


@settings(max_examples=scaled(60, 5_000))
@given(st.binary(max_size=600) | st.text(max_size=600).map(str.encode))
@example(b"\x80")  # found by this test: a UnicodeDecodeError escaped load()
def test_any_file_content_is_read_or_refused_with_a_message(
    tmp_path_factory: Any, raw: bytes
) -> None:
    tally("kvpilot.toml: arbitrary file content")
    path = tmp_path_factory.mktemp("cfg") / "kvpilot.toml"
    path.write_bytes(raw)
    try:
        load(str(path))
    except ConfigError as exc:
        assert str(exc).strip()


def test_a_file_that_is_not_utf8_or_not_a_file_is_named() -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "kvpilot.toml"
        path.write_bytes(b'[kvpilot]\ndatabase = "caf\xe9.db"\n')  # Latin-1, not UTF-8
        try:
            load(str(path))
        except ConfigError as exc:
            assert (
                "not UTF-8 text" in str(exc)
                and "0xe9" in str(exc)
                and "0xe9 on line 2 (offset 25)" in str(exc)
            )
        else:
            raise AssertionError("a Latin-1 file was read")
        try:
            load(d)
        except ConfigError as exc:
            assert str(exc).startswith(f"cannot read {d}: ")
        else:
            raise AssertionError("a directory was read")
