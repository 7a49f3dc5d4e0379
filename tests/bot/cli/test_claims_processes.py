"""Two bots over one estate, as processes: while one holds a server, `kvpilot console` and a
one-shot command of another configuration naming it are refused with the holder and the fix;
once the holder stops cleanly the other starts, and its own clean stop releases its claims."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from storage import claims as store
from tests.bot.cli.test_access_terminal import kvpilot  # `kvpilot ... --config` as a process
from tests.ports import free_port
from tests.twin_process import REPO

HOLD = """
import sys
from bot.app.claims import ClaimKeeper
from bot.app.config import load
keeper = ClaimKeeper(load(sys.argv[1]))
keeper.take()
keeper.start()
print("held", flush=True)
sys.stdin.readline()
print("released", keeper.stop(), flush=True)
"""


def write(tmp_path: Path, name: str, server: str, url: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(
        f'[kvpilot]\ndatabase = "{name}/kvpilot.db"\nstate_dir = "{name}/state"\n'
        f'claims = "shared/claims.db"\nbot_name = "{name}"\n'
        f'[servers.{server}]\nurl = "{url}"\n'
    )
    return path


def test_a_second_bot_is_refused_until_the_first_stops(tmp_path: Path) -> None:
    port = free_port()  # nothing answers there: neither bot needs the server to claim it
    east = write(tmp_path, "east", "big", f"http://LocalHost:{port}/")
    west = write(tmp_path, "west", "small", f"http://localhost:{port}")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(east)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "held"
        refused = kvpilot(west, "console", "-c", "help")
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.startswith('error: cannot start this bot: bot "west"')
        assert f'small (http://localhost:{port}) is held by bot "east"' in refused.stderr
        assert f"pid {holder.pid}), last renewed" in refused.stderr
        assert "kvpilot claims release east" in refused.stderr
        stop = kvpilot(west, "server", "stop", "--server", "small")
        assert stop.returncode == 2, stop.stderr
        assert "cannot run `kvpilot server`" in stop.stderr
        listed = kvpilot(west, "claims")
        assert listed.returncode == 0, listed.stderr
        assert 'bot "east"' in listed.stdout and "(live)" in listed.stdout
        live = kvpilot(west, "claims", "release", "east")
        assert live.returncode == 2 and "is live" in live.stderr and "--force" in live.stderr
    finally:
        holder.stdin.write("\n")
        holder.stdin.close()
        assert holder.stdout.readline().strip() == "released 1"
        holder.wait(timeout=30)
        holder.stdout.close()
    started = kvpilot(west, "console", "-c", "help")
    assert started.returncode == 0, started.stderr
    db = store.open_claims(tmp_path / "shared" / "claims.db")
    assert store.all_claims(db) == []  # the console's clean stop released its claim


def test_release_of_an_unknown_bot_and_without_a_claims_file(tmp_path: Path) -> None:
    west = write(tmp_path, "west", "small", "http://127.0.0.1:1")
    unknown = kvpilot(west, "claims", "release", "nobody")
    assert unknown.returncode == 2
    assert "bot 'nobody' holds no claims" in unknown.stderr
    lone = tmp_path / "lone.toml"
    lone.write_text('[servers.x]\nurl = "http://127.0.0.1:1"\n')
    bare = kvpilot(lone, "claims")
    assert bare.returncode == 2 and "names no claims file" in bare.stderr
    usage = kvpilot(west, "claims", "list", "east")
    assert usage.returncode == 2 and "name the bot only with release" in usage.stderr
