"""The command line, fuzzed from its own grammar: every command and flag with random values.

Property: `kvpilot ...` ends with an exit status of the table in bot/cli/exit_codes.py, or with
argparse's usage error (status 2) or help (0); never a traceback. It runs with no configuration, and
with one naming a server nothing listens for and no launcher: nothing can be changed.
"""

from __future__ import annotations

import argparse
import io
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from bot.cli.app import build_parser, main
from tests.fuzz.conftest import scaled, tally

# `serve` and `console` start the bot and wait for Slack or a terminal: started elsewhere.
LONG_RUNNING = {"serve", "console"}


def _commands() -> dict[str, list[str]]:
    """Each command (and `experiment VERB`) with the option strings it takes."""
    parser = build_parser()
    out: dict[str, list[str]] = {"": [o for a in parser._actions for o in a.option_strings]}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out[name] = [o for a in sub._actions for o in a.option_strings]
                for inner in sub._actions:
                    if isinstance(inner, argparse._SubParsersAction):
                        for verb, vsub in inner.choices.items():
                            out[f"{name} {verb}"] = [
                                o for a in vsub._actions for o in a.option_strings
                            ]
    return {k: v for k, v in out.items() if k.split(" ")[0] not in LONG_RUNNING}


COMMANDS = _commands()
EXIT_STATUSES = set(range(9))
WORDS = st.sampled_from(
    ["a", "a", "1", "99999999999999999999", "²", "incident", "kimi", "all", "--", "-", "0",
     "-1", "0.93", "1e309", "nan", "30m", "7d",
     "x" * 500, "mem_fraction_static=0.9", "mem_fraction_static=0.80..0.95", "k=", "=v",
     "--yes", "--json",
     "; rm -rf /", "$(reboot)", "`id`", "\x00", "\u202e", "é", "\n", "%s%n", "{}", "[]"]
)  # fmt: skip
VALUES = WORDS | st.text(max_size=30)


@st.composite
def argv(draw: st.DrawFn) -> list[str]:
    command = draw(st.sampled_from(sorted(COMMANDS)))
    words = command.split(" ") if command else []
    options = COMMANDS[command]
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["flag", "flag value", "word"]))
        if kind == "word" or not options:
            words.append(draw(VALUES))
            continue
        words.append(draw(st.sampled_from(options)))
        if kind == "flag value":
            words.append(draw(VALUES))
    return words


# A server nothing listens for (the discard port: refused at once) and no launcher: every
# command reaches the database and the configuration, and none can change anything.
CONFIG = '[servers.a]\nurl = "http://127.0.0.1:9"\ngpu_memory_gib = 80\n'


@pytest.fixture(autouse=True, params=["configured", "no configuration"])
def _nowhere(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """No tokens, a fresh directory, and a configuration of one unreachable server or none."""
    monkeypatch.chdir(tmp_path)
    for key in list(os.environ):
        if key.startswith(("KVPILOT_", "SLACK_")):
            monkeypatch.delenv(key)
    config = tmp_path / "kvpilot.toml"
    if request.param == "configured":
        config.write_text(CONFIG)
    monkeypatch.setenv("KVPILOT_CONFIG", str(config))
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    yield


@settings(max_examples=scaled(80, 8_000))
@given(argv())
@example(["experiments", "list", "--config", "\x00"])  # found: a ValueError
@example(["experiments", "show", "99999999999999999999"])  # found: an OverflowError
def test_any_command_line_ends_with_a_status_and_a_message(args: list[str]) -> None:
    assume(not any("://" in a for a in args))  # no URL: the fuzz must not reach a network
    tally("command line")
    out, err = io.StringIO(), io.StringIO()
    try:
        code = main(args, out=out, err=err)
    except SystemExit as exc:  # argparse: --help, --version (0) or a usage error (2)
        assert exc.code in (0, 2), args
        return
    assert code in EXIT_STATUSES, (args, code)
    if code != 0:
        assert err.getvalue().strip() or out.getvalue().strip(), (args, code)
