"""The systemd unit, its polkit rule, the SGLang unit and the environment file.

The units are checked with the real `systemd-analyze verify`. It refuses a unit whose
ExecStart= binary does not exist on this machine, and /opt/kvpilot or /opt/sglang exist only on
a GPU host, so each test verifies a copy whose ExecStart= names an existing interpreter instead;
every other line is the shipped file's.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bot.cli import build_parser
from bot.slack.serve import slack_settings
from playbooks.launchers.common import split_command
from playbooks.launchers.systemd_unit import UnitFile, effective_exec_start
from tests.deploy.units import DEPLOY, one, unit_settings

SYSTEMD = DEPLOY / "systemd"
needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here"
)


def verify_copy(unit: Path, binary: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    text = unit.read_text()
    exec_start = one(unit_settings(unit), "ExecStart")
    shipped = exec_start.split()[0]
    assert shipped.startswith("/"), "ExecStart= must name its binary by absolute path"
    copy = tmp_path / unit.name
    copy.write_text(text.replace(f"ExecStart={shipped} ", f"ExecStart={binary} ", 1))
    assert copy.read_text() != text
    return subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(copy)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@needs_analyze
@pytest.mark.parametrize("name", ["kvpilot.service", "sglang.service"])
def test_the_units_pass_systemd_analyze_verify(name: str, tmp_path: Path) -> None:
    done = verify_copy(SYSTEMD / name, sys.executable, tmp_path)
    assert done.returncode == 0, done.stderr
    # verify exits 0 on unknown keys and deprecated settings, but names the file: none allowed.
    assert name not in done.stderr, done.stderr


@needs_analyze
def test_the_backup_timer_and_service_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    """Their binaries (/bin/sh, /usr/bin/find) exist everywhere: verified as shipped."""
    names = ["kvpilot-backup.service", "kvpilot-backup.timer"]
    for name in names:
        shutil.copy(SYSTEMD / name, tmp_path / name)
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *(str(tmp_path / n) for n in names)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0 and "kvpilot-backup" not in done.stderr, done.stderr


@needs_analyze
def test_verify_does_refuse_a_broken_unit(tmp_path: Path) -> None:
    """The check above can fail: the same copy with a bad setting is refused."""
    unit = tmp_path / "src" / "kvpilot.service"
    unit.parent.mkdir()
    unit.write_text((SYSTEMD / "kvpilot.service").read_text().replace("Type=exec", "Type=exe"))
    done = verify_copy(unit, sys.executable, tmp_path)
    assert done.returncode != 0 or "kvpilot.service" in done.stderr


def test_the_bot_unit_runs_serve_as_its_own_user_with_the_promised_settings() -> None:
    s = unit_settings(SYSTEMD / "kvpilot.service")
    argv = shlex.split(one(s, "ExecStart"))
    assert argv[0] == "/opt/kvpilot/bin/kvpilot"
    ns = build_parser().parse_args(argv[1:])  # the command line the CLI really accepts
    assert (ns.command, ns.config, ns.port) == ("serve", "/etc/kvpilot/kvpilot.toml", 3000)
    assert one(s, "User") == "kvpilot" and one(s, "Group") == "kvpilot"
    assert one(s, "EnvironmentFile") == "/etc/kvpilot/kvpilot.env"  # required, no "-"
    assert one(s, "StateDirectory") == "kvpilot"
    assert one(s, "WorkingDirectory") == "/var/lib/kvpilot"
    assert one(s, "Restart") == "on-failure"
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "PrivateTmp": "yes",
        "ProtectHome": "read-only",
        "KillMode": "process",  # an SGLang child of the process launcher survives a restart
    }.items():
        assert one(s, key) == value, key
    # Each of these would cut an SGLang child off its GPUs or its JIT compilers.
    for key in ("PrivateDevices", "DeviceAllow", "ProtectClock", "MemoryDenyWriteExecute"):
        assert key not in s, key
    assert "AF_NETLINK" in one(s, "RestrictAddressFamilies")
    assert "systemd-journal" in one(s, "SupplementaryGroups").split()


def test_the_sglang_units_command_is_what_the_systemd_launcher_reads() -> None:
    path = SYSTEMD / "sglang.service"
    command = effective_exec_start([UnitFile(f"/etc/systemd/system/{path.name}", path.read_text())])
    assert command is not None
    exe, args = split_command(command.argv)
    assert exe == ["/opt/sglang/bin/python3", "-m", "sglang.launch_server"]
    pairs = dict(itertools.pairwise(args))
    assert pairs["--model-path"] == "moonshotai/Kimi-K2.5" and pairs["--tp-size"] == "8"
    assert pairs["--api-key"] == "${SGLANG_API_KEY}"  # kept for systemd to expand, never stored
    s = unit_settings(path)
    assert one(s, "Type") in ("simple", "exec")  # SGLang sends no READY=1


def run_rule(cases: list[dict[str, object]]) -> list[object]:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed here to run the polkit rule's JavaScript")
    harness = """
        const fs = require("fs");
        let rule = null;
        const polkit = {
            Result: { YES: "yes", NO: "no", AUTH_ADMIN: "auth_admin", NOT_HANDLED: null },
            addRule: (f) => { rule = f; },
        };
        eval(fs.readFileSync(process.argv[1], "utf8"));
        const cases = JSON.parse(process.argv[2]);
        console.log(JSON.stringify(cases.map((c) => rule(
            { id: c.id, lookup: (k) => c.details[k] }, { user: c.user }))));
    """
    done = subprocess.run(
        [node, "-e", harness, str(SYSTEMD / "50-kvpilot.rules"), json.dumps(cases)],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    result = json.loads(done.stdout)
    assert isinstance(result, list)
    return result


def test_the_polkit_rule_allows_the_sglang_unit_and_nothing_else() -> None:
    manage = "org.freedesktop.systemd1.manage-units"

    def case(user: str, action: str, unit: str = "", verb: str = "") -> dict[str, object]:
        return {"user": user, "id": action, "details": {"unit": unit, "verb": verb}}

    allowed = [case("kvpilot", manage, "sglang.service", v) for v in ("start", "stop", "restart")]
    allowed.append(case("kvpilot", "org.freedesktop.systemd1.reload-daemon"))
    refused = [
        case("kvpilot", manage, "ssh.service", "restart"),
        case("kvpilot", manage, "sglang.service", "kill"),
        case("mallory", manage, "sglang.service", "restart"),
        case("mallory", "org.freedesktop.systemd1.reload-daemon"),
        case("kvpilot", "org.freedesktop.systemd1.manage-unit-files", "sglang.service"),
        case("kvpilot", "org.freedesktop.login1.reboot"),
    ]
    assert run_rule(allowed) == ["yes"] * len(allowed)
    assert run_rule(refused) == [None] * len(refused)


def test_the_rule_and_the_unit_name_the_same_sglang_unit() -> None:
    rule = (SYSTEMD / "50-kvpilot.rules").read_text()
    unit = re.search(r'var SGLANG_UNIT = "([^"]+)"', rule)
    assert unit is not None
    paths = unit_settings(SYSTEMD / "kvpilot.service")["ReadWritePaths"]
    assert f"-/etc/systemd/system/{unit.group(1)}.d" in paths
    assert (SYSTEMD / unit.group(1)).is_file()


def env_example() -> dict[str, str]:
    values = {}
    for line in (SYSTEMD / "kvpilot.env.example").read_text().splitlines():
        if line and not line.startswith("#"):
            name, sep, value = line.partition("=")
            assert sep and name == name.strip() and not name.startswith("export")
            values[name] = value
    return values


def test_the_environment_file_sets_what_serve_reads() -> None:
    env = env_example()
    assert set(env) == {"SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "SGLANG_API_KEY"}
    # Placeholders have the right prefixes, so filling in the rest gives valid settings.
    filled = {k: v.replace("replace-me", "1-test") for k, v in env.items()}
    settings = slack_settings(filled)
    assert settings.socket_mode and settings.signing_secret is None
    # The commented HTTP-mode variant is valid too.
    http = {"SLACK_BOT_TOKEN": filled["SLACK_BOT_TOKEN"], "SLACK_SIGNING_SECRET": "abc123"}
    assert not slack_settings(http).socket_mode
    text = (SYSTEMD / "kvpilot.env.example").read_text()
    assert "#SLACK_SIGNING_SECRET=" in text and "0600" in text
