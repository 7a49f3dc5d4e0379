"""What a new operator runs into first: a bad invocation or an unusable database path gets a
message with the fix, never a traceback, and the shipped systemd unit's state directory holds
the database when the configuration names none."""

from __future__ import annotations

import importlib.metadata
import io
import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bot.app.config import load
from bot.cli import main
from storage import experiments as store
from storage.db import open_db


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        code = main(list(argv), out=out, err=err)
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def test_experiments_without_an_action_names_the_actions(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run("experiments")
    err += capsys.readouterr().err
    assert code == 2
    assert "Traceback" not in err
    assert "list" in err and "show" in err and "abort" in err, err


def test_a_database_path_that_cannot_be_created_is_named_with_the_fix(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the database's directory should be\n")
    config = tmp_path / "kvpilot.toml"
    config.write_text(
        f'[kvpilot]\ndatabase = "{blocker}/sub/kvpilot.db"\n\n'
        '[servers.a]\nurl = "http://127.0.0.1:9"\n'
    )
    code, _, err = run("experiments", "list", "--config", str(config))
    assert code == 2, err
    assert "Traceback" not in err
    assert f"{blocker}/sub" in err and "[kvpilot] database" in err, err


def test_without_a_database_key_the_units_state_directory_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """deploy/systemd/kvpilot.service sets StateDirectory=kvpilot, so systemd gives the bot
    STATE_DIRECTORY=/var/lib/kvpilot; its configuration in /etc/kvpilot is read-only."""
    etc, state = tmp_path / "etc", tmp_path / "state"
    etc.mkdir()
    (etc / "kvpilot.toml").write_text('[servers.a]\nurl = "http://127.0.0.1:9"\n')
    monkeypatch.setenv("STATE_DIRECTORY", str(state))
    config = load(str(etc / "kvpilot.toml"))
    assert config.database == state / "kvpilot.db"
    assert config.state_dir == state / "state"
    monkeypatch.delenv("STATE_DIRECTORY")
    config = load(str(etc / "kvpilot.toml"))  # elsewhere: beside the configuration, as before
    assert config.database == etc / "var" / "kvpilot.db"


@pytest.mark.parametrize("ttl", ["30", '"30"', "30.5", '"45 "'])
def test_a_duration_without_a_unit_is_refused_with_the_spellings(tmp_path: Path, ttl: str) -> None:
    """`approval_ttl = 30` was read as 30 seconds where thirty minutes was meant."""
    config = tmp_path / "kvpilot.toml"
    config.write_text(
        f'[access]\napproval_ttl = {ttl}\n\n[servers.a]\nurl = "http://127.0.0.1:9"\n'
    )
    code, _, err = run("experiments", "list", "--config", str(config))
    assert code == 2, err
    assert "access.approval_ttl" in err and "has no unit" in err and 'm" for minutes' in err, err


def test_a_duration_with_a_unit_is_read(tmp_path: Path) -> None:
    config = tmp_path / "kvpilot.toml"
    config.write_text('[access]\napproval_ttl = "45m"\n\n[servers.a]\nurl = "http://127.0.0.1:9"\n')
    access = load(str(config)).access
    assert access is not None and access.approval_ttl_s == 45 * 60


def test_version_is_the_installed_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = run("--version")
    assert code == 0
    assert capsys.readouterr().out.strip() == f"kvpilot {importlib.metadata.version('kvpilot')}"


def experiment_config(tmp_path: Path, change: dict[str, object] | None = None) -> Path:
    """A configuration whose database holds one experiment (created 2026-12-01 09:30 UTC)."""
    config = tmp_path / "kvpilot.toml"
    config.write_text('[servers.kimi]\nurl = "http://127.0.0.1:9"\n')
    db = open_db(load(str(config)).database)
    store.create_experiment(
        db,
        server="kimi",
        change=change or {"mem_fraction_static": 0.88},
        baseline_config={},
        trial_config={},
        settings={},
        actor="cli:alice",
        now=datetime(2026, 12, 1, 9, 30, tzinfo=UTC),
    )
    db.close()
    return config


def test_experiments_list_shows_the_change_as_typed_and_times_with_their_zone(
    tmp_path: Path,
) -> None:
    config = experiment_config(tmp_path, {"mem_fraction_static": 0.88, "hicache_size": 40})
    code, out, err = run("experiments", "list", "--config", str(config))
    assert code == 0, err
    row = out.splitlines()[1]
    assert "2026-12-01 09:30:00 UTC" in row
    assert row.endswith("hicache_size=40, mem_fraction_static=0.88"), row  # stored sorted


def test_experiment_show_reads_as_list_does(tmp_path: Path) -> None:
    config = experiment_config(tmp_path, {"mem_fraction_static": 0.88, "hicache_size": 40})
    code, out, err = run("experiment", "show", "1", "--config", str(config))
    assert code == 0, err
    assert "  change    hicache_size=40, mem_fraction_static=0.88\n" in out, out
    (created,) = [line for line in out.splitlines() if "-> proposed" in line]
    assert created.startswith("    2026-12-01 09:30:00 UTC  -"), created
    audit = out.split("  audit:\n", 1)[1].splitlines()
    assert audit and all(re.match(r"    \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC  ", a) for a in audit), (
        audit
    )


@pytest.mark.parametrize(
    ("spelling", "earlier"),
    [
        (("experiment", "list"), ("experiments", "list")),
        (("experiment", "show", "1"), ("experiments", "show", "1")),
        (("experiment", "list", "-o", "json"), ("experiments", "list", "--json")),
        (("experiment", "show", "1", "-o", "json"), ("experiments", "show", "1", "--json")),
    ],
)
def test_experiment_is_one_noun_with_verbs_and_the_earlier_spellings_stay(
    tmp_path: Path, spelling: tuple[str, ...], earlier: tuple[str, ...]
) -> None:
    config = experiment_config(tmp_path)
    new = run(*spelling, "--config", str(config))
    old = run(*earlier, "--config", str(config))
    assert new[0] == old[0] == 0, (new, old)
    assert new[1] == old[1]


def test_experiment_run_is_the_experiment_command(tmp_path: Path) -> None:
    config = experiment_config(tmp_path)
    code, _, err = run("experiment", "run", "--server", "kimi", "--config", str(config))
    assert code == 2 and "nothing to change: give --set KEY=VALUE" in err, err


def test_output_json_and_text_are_one_choice(tmp_path: Path) -> None:
    config = experiment_config(tmp_path)
    code, out, _ = run("experiment", "list", "--config", str(config), "-o", "text")
    assert code == 0 and out.startswith("  id  server")
    code, out, _ = run("experiment", "list", "--config", str(config), "--output", "json")
    assert code == 0 and json.loads(out)[0]["id"] == 1
