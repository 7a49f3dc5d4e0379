"""Claims in the bot (`bot/app/claims.py`, `bot/app/config/estate.py`): the configuration's
errors, the refusal's message, renewal, takeover and release, on a real claims file and a
clock the tests move (nothing sleeps)."""

from __future__ import annotations

import logging
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.app.claims import ClaimKeeper, ClaimRefused, held
from bot.app.config import Config, ConfigError, load
from bot.cli.doctor import claims_check
from storage import claims as store

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def config(tmp_path: Path, name: str, servers: dict[str, str], extra: str = "") -> Config:
    """Bot `name` with its own database, over `servers` (name -> URL), sharing claims.db."""
    path = tmp_path / f"{name}.toml"
    tables = "".join(f'[servers.{s}]\nurl = "{url}"\n' for s, url in servers.items())
    path.write_text(
        f'[kvpilot]\ndatabase = "{name}/kvpilot.db"\nclaims = "claims.db"\n'
        f'bot_name = "{name}"\n{extra}{tables}'
    )
    return load(str(path))


class Clock:
    def __init__(self) -> None:
        self.at = T0

    def __call__(self) -> datetime:
        return self.at

    def advance(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)


def test_without_the_key_a_bot_claims_nothing(tmp_path: Path) -> None:
    path = tmp_path / "kvpilot.toml"
    path.write_text('[servers.x]\nurl = "http://127.0.0.1:30000"\n')
    loaded = load(str(path))
    assert loaded.claims is None and ClaimKeeper.of(loaded) is None
    with held(loaded, "run it"):  # nothing to claim, nothing refused
        pass


def test_the_default_name_is_the_host_and_the_database(tmp_path: Path) -> None:
    path = tmp_path / "kvpilot.toml"
    path.write_text('[kvpilot]\nclaims = "/srv/claims.db"\n')
    loaded = load(str(path))
    assert loaded.claims is not None
    assert loaded.claims.path == Path("/srv/claims.db")
    assert loaded.claims.bot_name == f"{socket.gethostname()}:{tmp_path}/var/kvpilot.db"


@pytest.mark.parametrize(
    ("kvpilot", "servers", "message"),
    [
        ('bot_name = "east"\n', "", "only used with a shared claims file"),
        ('claims = "var/kvpilot.db"\n', "", "is this bot's own database"),
        ('claims = "shared/"\n', "", 'is a directory; name a file in it, e.g. claims = "shared/c'),
        ("claims = 3\n", "", "kvpilot.claims: expected a non-empty string"),
        ('claims = "c.db"\nbot_name = "east bot"\n', "", "is not a usable name"),
        ('claims = "c.db"\nbot_name = ""\n', "", "kvpilot.bot_name: expected a non-empty"),
        (
            'claims = "c.db"\n',
            '[servers.x]\nurl = "http://gpu-7:port"\n',
            "servers.x.url: 'http://gpu-7:port' has no valid port",
        ),
    ],
)
def test_configuration_errors_say_what_to_do(
    tmp_path: Path, kvpilot: str, servers: str, message: str
) -> None:
    path = tmp_path / "kvpilot.toml"
    path.write_text(f"[kvpilot]\n{kvpilot}{servers}")
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("?", r"\?")):
        load(str(path))


def test_an_existing_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "shared").mkdir()
    path = tmp_path / "kvpilot.toml"
    path.write_text('[kvpilot]\nclaims = "shared"\n')
    with pytest.raises(ConfigError, match="is a directory"):
        load(str(path))


def test_the_second_bot_is_refused_with_who_holds_and_the_fix(tmp_path: Path) -> None:
    clock = Clock()
    a = ClaimKeeper(config(tmp_path, "east", {"big": "http://GPU-7:30000/"}), now=clock)
    a.take()
    clock.advance(42)
    b_config = config(tmp_path, "west", {"small": "http://gpu-7:30000", "free": "http://gpu-8"})
    with pytest.raises(ClaimRefused) as refused:
        ClaimKeeper(b_config, now=clock).take()
    text = str(refused.value)
    assert text.startswith('cannot start this bot: bot "west"')
    assert 'small (http://gpu-7:30000) is held by bot "east", which it calls "big"' in text
    assert f"(host {socket.gethostname()}, pid " in text and "last renewed 42 s ago" in text
    assert "remove each of these servers from one of the two configurations" in text
    assert f"`kvpilot claims release east --config {b_config.path}`" in text
    assert "lease lapses (120 s" in text


def test_a_lapsed_claim_is_taken_over_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    ClaimKeeper(config(tmp_path, "east", {"big": "http://gpu-7:30000"}), now=clock).take()
    clock.advance(store.LEASE_S + 1)  # east crashed: it never renewed again
    caplog.set_level(logging.WARNING, "bot.app.claims")
    ClaimKeeper(config(tmp_path, "west", {"small": "http://gpu-7:30000"}), now=clock).take()
    assert 'took over big (http://gpu-7:30000) from bot "east"' in caplog.text
    assert "last renewed 121 s ago" in caplog.text


def test_renewal_keeps_the_claim_and_a_clean_stop_releases_it(tmp_path: Path) -> None:
    clock = Clock()
    a = ClaimKeeper(config(tmp_path, "east", {"big": "http://gpu-7:30000"}), now=clock)
    a.take()
    west = config(tmp_path, "west", {"small": "http://gpu-7:30000"})
    for _ in range(8):  # four minutes, renewed every 30 s
        clock.advance(30)
        a.renew()
    with pytest.raises(ClaimRefused, match="last renewed 0 s ago"):
        ClaimKeeper(west, now=clock).take()
    assert a.stop() == 1
    ClaimKeeper(west, now=clock).take()  # free at once, no lease to wait for


def test_a_claim_released_by_force_is_taken_back_or_reported_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    east = config(tmp_path, "east", {"big": "http://gpu-7:30000", "other": "http://gpu-9:1"})
    a = ClaimKeeper(east, now=clock)
    a.take()
    assert east.claims is not None
    db = store.open_claims(east.claims.path)
    store.release_bot(db, "east")
    a.renew()  # nobody took them: taken back
    assert {c.bot for c in store.all_claims(db)} == {"east"}
    store.release_bot(db, "east")
    ClaimKeeper(config(tmp_path, "west", {"small": "http://gpu-7:30000"}), now=clock).take()
    caplog.set_level(logging.ERROR, "bot.app.claims")
    a.renew()
    assert 'lost the claim on big (http://gpu-7:30000) to bot "west"' in caplog.text
    assert a.lost == {"http://gpu-7:30000": "west"}
    assert {c.url: c.bot for c in store.all_claims(db)} == {
        "http://gpu-7:30000": "west",
        "http://gpu-9:1": "east",
    }


def test_a_one_shot_command_holds_only_its_server_while_it_runs(tmp_path: Path) -> None:
    east = config(tmp_path, "east", {"big": "http://gpu-7:30000", "b2": "http://gpu-8:30000"})
    ClaimKeeper(config(tmp_path, "west", {"small": "http://gpu-8:30000"})).take()
    with held(east, "run `kvpilot experiment`", ["big"]):
        assert east.claims is not None
        db = store.open_claims(east.claims.path)
        assert {c.url for c in store.all_claims(db) if c.bot == "east"} == {"http://gpu-7:30000"}
    assert {c.bot for c in store.all_claims(db)} == {"west"}
    with (
        pytest.raises(ClaimRefused, match="cannot run `kvpilot experiment`"),
        held(east, "run `kvpilot experiment`", ["b2"]),
    ):
        pass


def test_doctor_says_which_servers_another_bot_holds(tmp_path: Path) -> None:
    east = config(tmp_path, "east", {"big": "http://gpu-7:30000"})
    west = config(tmp_path, "west", {"small": "http://gpu-7:30000", "free": "http://gpu-8:1"})
    first = claims_check(west)
    assert first.ok and "will be created at the first start" in first.detail
    keeper = ClaimKeeper(east)
    keeper.take()
    found = claims_check(west)
    assert not found.ok and not found.fatal
    assert 'small (http://gpu-7:30000) by bot "east"' in found.detail
    assert "kvpilot claims release BOT" in found.fix
    keeper.stop()
    assert claims_check(west).ok
