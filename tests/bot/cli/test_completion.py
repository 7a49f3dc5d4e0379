"""`kvpilot completion bash`, sourced by a real bash: what it offers at each point of a command
line, made from the parser itself (a new flag is completed without anyone editing a script)."""

from __future__ import annotations

import io
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from bot.cli import main
from bot.cli.app import build_parser


def script(shell: str = "bash") -> str:
    out = io.StringIO()
    assert main(["completion", shell], out=out, err=io.StringIO()) == 0
    return out.getvalue()


def offered(tmp_path: Path, line: str) -> list[str]:
    """What bash's completion offers after `line` (a trailing space: a new, empty word)."""
    words = shlex.split(line) + ([""] if line.endswith(" ") else [])
    path = tmp_path / "kvpilot.bash"
    path.write_text(script())
    program = (
        f"source {shlex.quote(str(path))}\n"
        f"COMP_WORDS=({' '.join(shlex.quote(w) for w in words)})\n"
        f"COMP_CWORD={len(words) - 1}\n"
        "_kvpilot_complete\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    bash = shutil.which("bash")
    assert bash is not None
    done = subprocess.run([bash, "--norc", "-c", program], capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return sorted(w for w in done.stdout.splitlines() if w)


@pytest.mark.parametrize(
    ("line", "expect"),
    [
        ("kvpilot do", ["doctor"]),
        ("kvpilot experiment ", ["abort", "approve", "list", "reject", "run", "show"]),
        ("kvpilot experiment l", ["list"]),
        ("kvpilot experiment run --s", ["--server", "--set"]),
        ("kvpilot experiment list --server kimi -", None),  # the flags of experiments list
        ("kvpilot experiments show --o", ["--output"]),
        ("kvpilot server st", ["start", "status", "stop"]),
        ("kvpilot doctor -o ", ["json", "text"]),
        ("kvpilot diagnose --server kimi -o j", ["json"]),
        ("kvpilot completion ", ["bash", "zsh"]),
        ("kvpilot report --since", ["--since"]),
    ],
)
def test_what_bash_offers(tmp_path: Path, line: str, expect: list[str] | None) -> None:
    got = offered(tmp_path, line)
    if expect is not None and not any(e.startswith("-") for e in expect):
        got = [g for g in got if not g.startswith("-")]  # the words; flags are offered too
    if expect is None:
        assert "--server" in got and "--config" in got and "-o" in got, got
    else:
        assert got == expect


def test_a_flags_value_is_left_to_file_names(tmp_path: Path) -> None:
    assert offered(tmp_path, "kvpilot doctor --config ") == []  # `complete -o default`: files


def test_every_command_and_flag_of_the_parser_is_in_the_script() -> None:
    text = script()
    parser = build_parser()
    (top,) = [line for line in text.splitlines() if line.startswith("    [kvpilot]=")][:1]
    commands = [n for a in parser._actions for n in (getattr(a, "choices", None) or [])]
    assert commands and top.split("=", 1)[1].strip("'").split() == commands
    assert "complete -o default -F _kvpilot_complete kvpilot" in text
    assert script("zsh").startswith("autoload -U +X bashcompinit && bashcompinit\n")
