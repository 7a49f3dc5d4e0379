"""The example kvpilot.toml files load through the real configuration parser and fit the unit.

Each example claims a launcher kind; the parser's own checks (every key, every table) and the
launcher factory decide whether the claim holds. The paths they use must be the ones the
systemd unit and the container image provide.
"""

from __future__ import annotations

import itertools
import tomllib
from pathlib import Path

import pytest

from bot.app.config import Config, ConfigError, parse
from playbooks.clock import WallClock
from playbooks.launchers import factory
from playbooks.launchers.common import split_command
from playbooks.launchers.systemd import SystemdLauncher
from tests.deploy.units import DEPLOY, REPO, one, unit_settings

EXAMPLES = DEPLOY / "examples"
STATE = Path("/var/lib/kvpilot")


def load(name: str) -> Config:
    path = EXAMPLES / name
    return parse(tomllib.loads(path.read_text()), path)


def test_the_process_example_runs_kimi_on_eight_gpus_with_every_section() -> None:
    config = load("kvpilot-process.toml")
    assert list(config.servers) == ["kimi"]
    server = config.servers["kimi"]
    assert server.launcher is not None and server.launcher.kind == "process"
    exe, args = split_command(server.launcher.command)
    assert exe[1:] == ["-m", "sglang.launch_server"]
    flags = dict(itertools.pairwise(args))
    assert flags["--model-path"] == "moonshotai/Kimi-K2.5"
    assert flags["--tp-size"] == "8" and "--enable-metrics" in args
    assert server.url.endswith(":" + flags["--port"])
    assert server.launcher.env["CUDA_VISIBLE_DEVICES"].count(",") == 7
    assert config.access is not None and config.access.approvers and not config.deprecations
    assert (
        server.gate.min_effect == 0.03
        and server.gate.baseline_s == 600
        and server.gate.max_trial_s == 1800
    )
    assert config.sampler.interval_s == 15
    assert [r.servers for r in config.reports] == [("kimi",)]


def test_the_systemd_example_drives_units_here_and_over_ssh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SGLANG_API_KEY", "sk-example-key")
    config = load("kvpilot-systemd.toml")
    kinds = {name: s.launcher.kind for name, s in config.servers.items() if s.launcher}
    assert kinds == {"kimi-1": "systemd", "kimi-2": "systemd"}
    assert all(s.api_key == "sk-example-key" for s in config.servers.values())
    local, remote = config.servers["kimi-1"], config.servers["kimi-2"]
    assert local.launcher is not None and remote.launcher is not None
    assert local.launcher.options["ssh_host"] is None and local.launcher.options["sudo"] is False
    assert remote.launcher.options["ssh_host"] == "kvpilot@gpu-2.internal"
    assert remote.launcher.options["unit"] == "sglang.service"
    for server in (local, remote):
        launcher = factory.build(
            "systemd",
            server.launcher.options,  # type: ignore[union-attr]
            url=server.url,
            ready_timeout_s=1800,
            clock=WallClock(),
            base_dir=EXAMPLES,
        )
        assert isinstance(launcher, SystemdLauncher)
    group, members = config.group_servers("kimi")
    assert group.max_concurrent_restarts == 1 and len(members) == 2
    assert config.reports[0].servers == ("kimi-1", "kimi-2")
    assert config.access is not None and config.access.four_eyes and config.access.names_local


def test_the_systemd_example_says_which_variable_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SGLANG_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="SGLANG_API_KEY is not set"):
        load("kvpilot-systemd.toml")


@pytest.mark.parametrize("name", ["kvpilot-process.toml", "kvpilot-systemd.toml"])
def test_the_examples_keep_their_state_where_the_unit_and_the_image_provide_it(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SGLANG_API_KEY", "sk-example-key")
    config = load(name)
    assert config.database.parent == STATE and config.state_dir.is_relative_to(STATE)
    unit = unit_settings(DEPLOY / "systemd" / "kvpilot.service")
    assert Path("/var/lib") / one(unit, "StateDirectory") == STATE
    assert f'VOLUME ["{STATE}"]' in (DEPLOY / "docker" / "Dockerfile").read_text()


def test_the_systemd_examples_unit_is_the_one_the_rule_and_the_unit_file_allow(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SGLANG_API_KEY", "sk-example-key")
    local = load("kvpilot-systemd.toml").servers["kimi-1"]
    assert local.launcher is not None
    unit = local.launcher.options["unit"]
    dropins = f"{local.launcher.options['dropin_dir']}/{unit}.d"
    assert f"-{dropins}" in unit_settings(DEPLOY / "systemd" / "kvpilot.service")["ReadWritePaths"]
    assert f'"{unit}"' in (DEPLOY / "systemd" / "50-kvpilot.rules").read_text()


def test_the_deploy_readme_lists_every_file_in_deploy() -> None:
    readme = (DEPLOY / "README.md").read_text()
    files = [p for p in DEPLOY.rglob("*") if p.is_file() and p.name != "README.md"]
    assert len(files) >= 8
    missing = [
        str(p.relative_to(DEPLOY)) for p in files if str(p.relative_to(DEPLOY)) not in readme
    ]
    assert not missing, f"deploy/README.md does not mention {missing}"
    assert ".dockerignore" in readme and (REPO / ".dockerignore").is_file()
