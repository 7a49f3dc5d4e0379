"""The systemd launcher's unit files: quoting, drop-ins checked by the real `systemd-analyze`,
the operator's unit left untouched, SSH, and the errors an operator can act on."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from playbooks.engines.sglang.allow_list import with_change
from playbooks.launchers.base import LaunchError
from playbooks.launchers.systemd import Shell, SystemdLauncher, SystemdSpec
from playbooks.launchers.systemd_unit import (
    ExecCommand,
    UnitFile,
    UnitSyntaxError,
    effective_exec_start,
    parse_exec,
    quote_word,
    render_dropin,
    split_cat_output,
    split_words,
)
from tests.playbooks.launchers import fake_systemd
from tests.playbooks.launchers.harness import UNIT, Harness, systemd_harness

TRICKY = [
    "--model-path",
    "/models/Llama 3.1 (8B)",
    "--served-model-name",
    'it\'s "quoted"',
    "--chat-template",
    "a\\b;c",
    "--empty",
    "",
    "--tab",
    "x\ty",
    "--port",
    "${PORT}",
]


def test_words_survive_quoting() -> None:
    line = " ".join(quote_word(w) for w in TRICKY)
    assert split_words(line) == TRICKY
    # A POSIX shell-like reader (the fake manager's) agrees, apart from C escapes such as \t.
    plain = [w for w in TRICKY if "\t" not in w]
    assert shlex.split(" ".join(quote_word(w) for w in plain)) == plain
    assert quote_word("--mem-fraction-static") == "--mem-fraction-static"
    assert quote_word("0.88") == "0.88"
    assert quote_word("a b") == '"a b"'


def test_exec_lines_prefixes_escapes_and_errors() -> None:
    assert parse_exec("-/usr/bin/python3 -m x").prefix == "-"
    assert parse_exec("  +@/bin/x a").argv == ["/bin/x", "a"]
    assert split_words(r"a\x41 'b c' \"d") == ["aA", "b c", '"d']
    with pytest.raises(UnitSyntaxError, match="unbalanced quoting"):
        split_words('/bin/x "open')


def test_cat_output_resets_and_the_operators_command() -> None:
    text = (
        "# /usr/lib/systemd/system/sglang.service\n"
        "[Service]\n"
        "# /etc/not/a/file/boundary\n"
        "ExecStart=/usr/bin/python3 -m sglang.launch_server \\\n"
        "    --port 30000\n"
        "\n"
        "# /etc/systemd/system/sglang.service.d/10-env.conf\n"
        "[Service]\nEnvironment=A=1\n"
        "\n"
        "# /etc/systemd/system/sglang.service.d/90-kvpilot.conf\n"
        "[Service]\nExecStart=\nExecStart=/usr/bin/python3 -m sglang.launch_server --port 1\n"
    )
    files = split_cat_output(text, "sglang.service")
    assert [f.path.rsplit("/", 1)[-1] for f in files] == [
        "sglang.service",
        "10-env.conf",
        "90-kvpilot.conf",
    ]
    own = effective_exec_start(files, skip="/etc/systemd/system/sglang.service.d/90-kvpilot.conf")
    assert own is not None and own.argv[-2:] == ["--port", "30000"]
    live = effective_exec_start(files)
    assert live is not None and live.argv[-1] == "1"
    two = [*files[:1], UnitFile("/x/sglang.service.d/a.conf", "[Service]\nExecStart=/bin/y\n")]
    with pytest.raises(UnitSyntaxError, match="more than once"):
        effective_exec_start(two)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is absent")
def test_the_generated_dropin_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    unit = tmp_path / "sglang.service"
    unit.write_text(
        "[Unit]\nDescription=SGLang\n\n[Service]\nType=simple\n"
        f"ExecStart={sys.executable} -m sglang.launch_server --port 30000\n"
        "Restart=on-failure\n\n[Install]\nWantedBy=multi-user.target\n"
    )
    dropin = tmp_path / "sglang.service.d" / "90-kvpilot.conf"
    dropin.parent.mkdir()
    dropin.write_text(render_dropin(ExecCommand("", [sys.executable, "-m", "x", *TRICKY])))

    def verify() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["systemd-analyze", "verify", "--man=no", str(unit)],
            capture_output=True,
            text=True,
            check=False,
        )

    done = verify()
    assert done.returncode == 0 and "kvpilot.conf" not in done.stderr, done.stderr
    # The verifier does read the drop-in: the same file with broken quoting is refused.
    dropin.write_text(dropin.read_text().replace('"/models/Llama', '"/models/Llama"" "'))
    done = verify()
    assert done.returncode != 0 or "quoting" in done.stderr, done.stderr


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    with systemd_harness(tmp_path, monkeypatch) as h:
        yield h


def test_the_operators_unit_is_never_edited_and_a_revert_removes_the_dropin(host: Harness) -> None:
    root = host.extra["root"]
    unit_file = fake_systemd.unit_dir(root) / UNIT
    before = unit_file.read_bytes()
    dropin = fake_systemd.etc_dir(root) / f"{UNIT}.d" / "90-kvpilot.conf"
    launcher = host.launcher()
    trial = with_change(host.baseline, {"mem_fraction_static": 0.88})
    launcher.apply(trial)
    assert unit_file.read_bytes() == before
    assert "ExecStart=\n" in dropin.read_text()
    assert host.info()["mem_fraction_static"] == 0.88
    launcher.apply(host.baseline)
    assert not dropin.exists() and unit_file.read_bytes() == before
    assert host.info()["mem_fraction_static"] == 0.85
    # A later drop-in that sets ExecStart= again wins over kvpilot's: said, not ignored.
    later = fake_systemd.etc_dir(root) / f"{UNIT}.d" / "95-operator.conf"
    later.write_text("[Service]\nExecStart=\nExecStart=/bin/true\n")
    with pytest.raises(LaunchError, match=r"95-operator\.conf"):
        launcher.apply(trial)


def test_over_ssh_arguments_survive_both_shells(
    host: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in `ssh` runs the remote command line with `sh -c`, as sshd does."""
    calls = tmp_path / "ssh-calls"
    fake_ssh = tmp_path / "bin" / "ssh"
    fake_ssh.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$*" >> {shlex.quote(str(calls))}\n'
        'while [ "$1" != "--" ]; do shift; done\nshift 2\nexec sh -c "$1"\n'
    )
    fake_ssh.chmod(0o755)
    dropins = str(fake_systemd.etc_dir(host.extra["root"]))
    launcher = SystemdLauncher(
        SystemdSpec(
            unit=UNIT,
            url=host.url,
            ssh_host="root@gpu-7",
            ssh_options=["-i", "/etc/kvpilot/id_ed25519"],
            dropin_dir=dropins,
            ready_timeout_s=30,
        )
    )
    name = 'it\'s a "model"; $(touch /tmp/kvpilot-injected)'
    args = [*host.baseline, "--served-model-name", name]
    launcher.apply(args)
    assert launcher.current_args() == args
    assert host.info()["served_model_name"] == name
    assert not Path("/tmp/kvpilot-injected").exists()
    first = calls.read_text().splitlines()[0]
    assert first.startswith(
        "-o BatchMode=yes -o ConnectTimeout=15 -i /etc/kvpilot/id_ed25519 -- root@gpu-7 "
    )


def test_errors_an_operator_can_act_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_systemd.install_tools(tmp_path / "host", tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    url = "http://127.0.0.1:9"
    missing = SystemdLauncher(SystemdSpec(unit="nope.service", url=url, ready_timeout_s=30))
    with pytest.raises(LaunchError, match=r"cannot read the unit nope.service.*No files found"):
        missing.current_args()
    assert "not-found" in missing.state().reason
    unreachable = SystemdLauncher(SystemdSpec(unit=UNIT, url=url, ssh_host="gpu-7"))
    ssh = tmp_path / "bin" / "ssh"
    ssh.write_text("#!/bin/sh\necho 'ssh: connect to host gpu-7: No route to host' >&2\nexit 255\n")
    ssh.chmod(0o755)
    with pytest.raises(LaunchError, match="cannot reach gpu-7 over SSH: ssh: connect to host"):
        unreachable.current_args()
    # An executable that is not there: systemd's 203/EXEC, read as systemd's failure (not the
    # server's exit), with the executor's own words from the journal.
    broken = fake_systemd.unit_dir(tmp_path / "host") / "broken.service"
    broken.parent.mkdir(parents=True)
    broken.write_text(
        "[Service]\nExecStart=/opt/nowhere/python3 -m sglang.launch_server --port 1\n"
    )
    subprocess.run(["systemctl", "daemon-reload"], check=True)
    spec = SystemdSpec(
        unit="broken.service",
        url=url,
        dropin_dir=str(fake_systemd.etc_dir(tmp_path / "host")),
        ready_timeout_s=30,
    )
    with pytest.raises(LaunchError) as failure:
        SystemdLauncher(spec).apply(["--port", "2"])
    assert (
        "systemd could not start the command (203/EXEC): Failed to locate executable "
        "/opt/nowhere/python3: No such file or directory; check that ExecStart='s program"
    ) in failure.value.reason, failure.value.reason
    assert "Failed at step EXEC spawning /opt/nowhere/python3" in failure.value.log_tail
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(LaunchError, match="`systemctl` is not installed here"):
        missing.current_args()


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client installed")
def test_the_real_ssh_client_parses_the_command_line_as_meant() -> None:
    """`ssh -G` prints the configuration it would connect with, without connecting."""
    spec = SystemdSpec(
        unit=UNIT, url="http://x", ssh_host="kvpilot@gpu-7", ssh_options=["-p", "2222"]
    )
    argv = Shell(spec).argv(["systemctl", "--no-pager", "cat", "--", UNIT])
    done = subprocess.run(
        ["ssh", "-G", *argv[1:]], capture_output=True, text=True, check=False, timeout=30
    )
    assert done.returncode == 0, done.stderr
    seen = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert (seen["user"], seen["hostname"], seen["port"]) == ("kvpilot", "gpu-7", "2222")
    assert (seen["batchmode"], seen["connecttimeout"]) == ("yes", "15")
