"""`[access]` in the terminal, end to end: `kvpilot` and `kvpilot console` run as processes.

The account running the tests is the terminal's identity (from its uid). Listed as
`local:NAME`, it gets the roles listed; unlisted while another local account is named, it may
only read; a policy still in `[slack]` works, with one `warning:` line per key to move.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bot.app.identity import os_user
from bot.chat.auth import person
from storage import audit
from storage.db import open_db
from tests.bot.harness import twin_config
from tests.ports import free_port
from tests.twin_process import REPO

ME = person("cli:" + os_user())  # local:NAME


def kvpilot(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", *args, "--config", str(config)],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
    )


def denied(config: Path) -> list[tuple[str, str]]:
    db = open_db(config.parent / "var" / "kvpilot.db")
    return [(e["actor"], e["properties"]["action"]) for e in audit.events(db, name="access_denied")]


@pytest.mark.parametrize(
    ("access", "args", "code", "needle"),
    [
        # another local account is named and this one is not: it may only read
        (
            '[access]\napprovers = ["local:kvp-nobody"]\n',
            ("server", "stop", "--server", "incident"),
            2,
            "error: refused: only operators and approvers may restart",
        ),
        (
            '[access]\napprovers = ["local:kvp-nobody"]\n',
            ("experiment", "--server", "incident", "--set", "mem_fraction_static=0.88", "--yes"),
            2,
            f'add "{ME}" there',
        ),
        (
            '[access]\napprovers = ["local:kvp-nobody"]\n',
            ("experiments", "abort", "1"),
            2,
            "only operators and approvers may abort",
        ),
        ('[access]\napprovers = ["local:kvp-nobody"]\n', ("experiments", "list"), 0, ""),
        # listed as an operator: it may stop a server (nothing runs here)
        (
            f'[access]\napprovers = ["U2"]\noperators = ["{ME}"]\n',
            ("server", "stop", "--server", "incident"),
            0,
            "",
        ),
        # no local account named: every role, as before
        ('[access]\napprovers = ["U2"]\n', ("server", "stop", "--server", "incident"), 0, ""),
    ],
)
def test_the_command_line_honours_access(
    tmp_path: Path, access: str, args: tuple[str, ...], code: int, needle: str
) -> None:
    config = twin_config(tmp_path, free_port(), slack=access)
    run = kvpilot(config, *args)
    assert run.returncode == code, run.stderr
    assert needle in run.stderr and "Traceback" not in run.stderr
    assert "warning:" not in run.stderr
    expected = [("cli:" + os_user(), needle_action(run.stderr))] if code else []
    assert denied(config) == expected


def needle_action(stderr: str) -> str:
    for action in ("restart", "propose", "abort"):
        if f"may {action}" in stderr:
            return action
    raise AssertionError(stderr)


def test_the_console_honours_access(tmp_path: Path) -> None:
    config = twin_config(
        tmp_path, free_port(), slack='[access]\napprovers = ["local:kvp-nobody"]\n'
    )
    run = kvpilot(
        config, "console", "-c", "propose incident mem_fraction_static=0.88", "-c", "history"
    )
    text = run.stdout + run.stderr
    assert "only operators and approvers may propose" in text, text
    assert "No experiments yet" in text and "Traceback" not in text
    assert denied(config) == [("console:" + os_user(), "propose")]


def test_the_policy_in_slack_still_works_with_one_note_per_key(tmp_path: Path) -> None:
    legacy = '[slack]\napprovers = ["U2"]\nfour_eyes = true\nchannels = ["C1"]\n'
    config = twin_config(tmp_path, free_port(), slack=legacy)
    run = kvpilot(config, "experiments", "list")
    assert run.returncode == 0, run.stderr
    warnings = [line for line in run.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: {config}: [slack] {key} is deprecated; move it to [access] {key} (same "
        "value); [slack] keeps only channels"
        for key in ("approvers", "four_eyes")
    ]


def test_both_places_at_once_is_refused_with_which_to_keep(tmp_path: Path) -> None:
    both = '[access]\napprovers = ["U2"]\n[slack]\nfour_eyes = true\n'
    config = twin_config(tmp_path, free_port(), slack=both)
    run = kvpilot(config, "experiments", "list")
    assert run.returncode == 2
    assert "error: slack.four_eyes and [access] both say who may do what: keep [access]" in (
        run.stderr
    )
