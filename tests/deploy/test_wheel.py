"""The package an operator installs: `make dist`'s wheel in a fresh virtual environment, used
from outside the checkout. It carries the bot and its playbooks, not the twin or the
benchmarks, and it reaches the deployment files kvpilot ships (`kvpilot files`)."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.paths import REPO
from tests.twin_process import TwinProcess, running_twin

UV = REPO / ".venv" / "bin" / "uv"


def make_dist(dest: Path) -> subprocess.Popen[str]:
    argv = ["make", "--no-print-directory", "dist", f"DIST={dest}"]
    return subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The wheel built as `make dist` builds it, installed with the locked dependencies."""
    work = tmp_path_factory.mktemp("wheel")
    # two builds at once, as beside other work in the checkout: neither may break the other
    builds = [make_dist(work / name) for name in ("dist", "again")]
    for build in builds:
        out, _ = build.communicate(timeout=300)
        assert build.returncode == 0, out
    (wheel,) = (work / "dist").glob("kvpilot-*.whl")
    (again,) = (work / "again").glob("kvpilot-*.whl")
    with zipfile.ZipFile(wheel) as one, zipfile.ZipFile(again) as other:
        assert one.namelist() == other.namelist()
    env = work / "env"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    for argv in (
        [str(UV), "pip", "install", "--quiet", "--python", str(python), "--require-hashes",
         "--no-deps", "-r", str(REPO / "requirements.lock")],
        [str(UV), "pip", "install", "--quiet", "--python", str(python), "--no-deps", str(wheel)],
    ):  # fmt: skip
        done = subprocess.run(argv, cwd=work, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
    yield env


@pytest.fixture(scope="module")
def twin() -> Iterator[TwinProcess]:
    with running_twin(["--time-scale", "100", "--enable-metrics"]) as t:
        yield t


def run(env: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A command of the installed environment, away from the checkout (its folders are not on
    the path: a module found only there would fail here)."""
    clean = {"PATH": f"{env / 'bin'}:/usr/bin:/bin", "HOME": str(cwd)}
    return subprocess.run(
        [str(env / "bin" / argv[0]), *argv[1:]], cwd=cwd, env=clean, capture_output=True,
        text=True, check=False, timeout=300,
    )  # fmt: skip


def test_the_wheel_holds_the_bot_and_not_the_twin(installed: Path, tmp_path: Path) -> None:
    shown = run(installed, "kvpilot", "--version", cwd=tmp_path)
    assert shown.returncode == 0 and shown.stdout.startswith("kvpilot "), shown
    found = run(installed, "python", "-c", "import bot.cli, playbooks, storage", cwd=tmp_path)
    assert found.returncode == 0, found.stderr
    for absent in ("sim", "bench", "tests"):
        gone = run(installed, "python", "-c", f"import {absent}", cwd=tmp_path)
        assert gone.returncode != 0 and "No module named" in gone.stderr, (absent, gone)
    demo = run(installed, "python", "-m", "bot.console.demo", "--yes", cwd=tmp_path)
    assert demo.returncode == 2 and "run `make demo` in a checkout" in demo.stderr, demo


def test_the_installed_kvpilot_checks_and_diagnoses_a_server(
    installed: Path, twin: TwinProcess, tmp_path: Path
) -> None:
    config = tmp_path / "kvpilot.toml"
    config.write_text(f'[kvpilot]\ntime_scale = 100\n\n[servers.kimi]\nurl = "{twin.url}"\n')
    doctor = run(installed, "kvpilot", "doctor", "--config", str(config), cwd=tmp_path)
    assert "ok   server kimi: " in doctor.stdout and "SGLang" in doctor.stdout, doctor.stdout
    diagnosis = run(
        installed, "kvpilot", "diagnose", "--server", twin.url, "--time-scale", "100",
        "--json", cwd=tmp_path,
    )  # fmt: skip
    assert diagnosis.returncode == 0, diagnosis.stderr[-2000:]
    assert '"bottleneck"' in diagnosis.stdout


@pytest.mark.parametrize(
    ("name", "source"),
    [
        ("slack-manifest", "deploy/slack/manifest.yaml"),
        ("systemd-unit", "deploy/systemd/kvpilot.service"),
        ("systemd-env", "deploy/systemd/kvpilot.env.example"),
    ],
)
def test_the_deployment_files_ship_with_it(
    installed: Path, tmp_path: Path, name: str, source: str
) -> None:
    shown = run(installed, "kvpilot", "files", name, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == (REPO / source).read_text()


def test_the_checkouts_own_kvpilot_shows_the_same_files() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "bot.cli", "files", "slack-manifest"], cwd=REPO,
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert shown.stdout == (REPO / "deploy" / "slack" / "manifest.yaml").read_text(), shown.stderr
