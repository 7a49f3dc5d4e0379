"""A bot whose claim another operator released by force, and another bot then took, stops
changing that server (`bot/app/claims.py` `lost_refusal`): the pure decision as a table, then
two bots on a real claims file, the loser refusing what would change the server."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from bot.app.claims import LEASE_S, RENEW_S, ClaimKeeper, lost_refusal
from bot.app.config import Config, load
from bot.app.health import Part
from bot.app.runtime import Runtime
from bot.app.wiring import Posting
from bot.chat.identity import OPAQUE
from bot.chat.runner import ClaimLost, ExperimentRunner
from bot.cli.doctor import claims_check
from playbooks.clock import at_scale
from playbooks.experiments.ownership import ActingRefused
from storage import claims as store
from storage import experiments as experiments_store
from storage.chat import MessageRef
from storage.db import open_db
from tests.bot.app.test_claims import Clock
from tests.bot.chat.test_runner_errors import Recorder

URL = "http://gpu-7:30000"


@pytest.mark.parametrize(
    ("server", "url", "lost", "says"),
    [
        ("big", URL, {}, None),  # nothing lost: it may act
        ("big", URL, {"http://gpu-9:1": "west"}, None),  # another of its servers was lost
        (
            "big",
            URL,
            {URL: "west"},
            [
                'cannot restart the server on `big`: bot "west" holds its claim now',
                "released by force while it ran",
                "remove [servers.big] from /etc/kvpilot/east.toml and restart this bot",
                'or release it from bot "west"',
            ],
        ),
    ],
)
def test_a_lost_server_is_refused_naming_it_its_holder_and_the_fix(
    server: str, url: str, lost: dict[str, str], says: list[str] | None
) -> None:
    text = lost_refusal(server, url, lost, "restart the server", "/etc/kvpilot/east.toml")
    if says is None:
        assert text is None
    else:
        assert text is not None and all(part in text for part in says), text


def bot_config(tmp_path: Path, name: str, servers: dict[str, str]) -> Config:
    """Bot `name` with its own database and a process launcher, sharing claims.db."""
    path = tmp_path / f"{name}.toml"
    tables = "".join(
        f'[servers.{s}]\nurl = "{url}"\n[servers.{s}.launcher]\nkind = "process"\n'
        'command = ["true"]\n'
        for s, url in servers.items()
    )
    path.write_text(
        f'[kvpilot]\ndatabase = "{name}/kvpilot.db"\nclaims = "claims.db"\n'
        f'bot_name = "{name}"\n{tables}'
    )
    return load(str(path))


def test_the_bot_that_lost_a_claim_refuses_to_change_the_server(tmp_path: Path) -> None:
    clock = Clock()
    clock.at = datetime.now(UTC)  # `kvpilot doctor` reads the claims on the wall clock
    east_config = bot_config(tmp_path, "east", {"big": URL, "other": "http://gpu-9:1"})
    east = ClaimKeeper(east_config, now=clock)
    east.take()
    db = open_db(east_config.database)
    exp = experiments_store.create_experiment(
        db, server="big", change={"max_running_requests": 16}, baseline_config={"args": []},
        trial_config={"args": []}, settings={}, actor="U1", now=datetime.now(UTC),
        state=experiments_store.State.trial,
    )  # fmt: skip
    surface = Recorder()
    runner = ExperimentRunner(Posting(east_config, lambda: db, at_scale(1.0), lambda _: surface))
    runner.refusal = east.refusal
    lease = runner.lease(exp, "big")
    lease.check()  # its own server: it acts
    # another operator: `kvpilot claims release east --force`, and bot west starts
    assert east_config.claims is not None
    store.release_bot(store.open_claims(east_config.claims.path), "east")
    ClaimKeeper(bot_config(tmp_path, "west", {"small": URL}), now=clock).take()
    east.renew()
    assert east.lost_view() == [{"server": "big", "url": URL, "held_by": "west"}]
    assert east.refusal("other", "restart the server") is None  # still its own
    doctor = claims_check(east_config)
    assert not doctor.ok and "bot 'east', running, has lost them" in doctor.detail
    with pytest.raises(ClaimLost, match=r'cannot abort experiment \d+ on `big`: bot "west"'):
        runner.abort(exp, actor="U2")
    with pytest.raises(ActingRefused, match='bot "west" holds its claim now'):
        lease.check()  # the experiment it carried stops at its next check
    runner.start(exp, thread=None)  # nor is it carried again
    row = experiments_store.get_experiment(db, exp)
    assert runner.running() == [] and row.lease_owner is None
    assert row.state == experiments_store.State.trial  # left where it stands, not reverted
    thread = MessageRef("C0OPS", "100.1")
    runner._ended(exp, None, ActingRefused("bot west holds it"), surface, None, thread)
    [(text, where)] = surface.posts
    assert where == thread
    assert f"Experiment {exp} is paused where it stands (trial): bot west holds it" in text
    east.stop()


def test_healthz_lists_the_lost_claims(tmp_path: Path) -> None:
    clock = Clock()
    config = bot_config(tmp_path, "east", {"big": URL})
    runtime = Runtime(config, surface_for=lambda _c: Recorder(), ids=OPAQUE)
    assert runtime.claims is not None
    runtime.claims.now = clock
    runtime.claims.take()
    transport = Part("transport", True, "connected")
    assert runtime.health(transport)[1]["claims_lost"] == []
    assert config.claims is not None
    store.release_bot(store.open_claims(config.claims.path), "east")
    ClaimKeeper(bot_config(tmp_path, "west", {"small": URL}), now=clock).take()
    runtime.claims.renew()
    _status, body = runtime.health(transport)
    assert body["claims_lost"] == [{"server": "big", "url": URL, "held_by": "west"}]
    assert runtime.flow.refusal("big", "propose a change") is not None
    runtime.claims.stop()
    runtime.close()


def test_a_bot_that_cannot_renew_stops_changing_its_servers_before_its_lease_lapses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claims file unreachable (a network share gone, a lock held): after LEASE_S another
    bot may take the servers, so this one stops changing them before then, and goes on once a
    renewal succeeds."""
    clock = Clock()
    east = ClaimKeeper(bot_config(tmp_path, "east", {"big": URL}), now=clock)
    east.take()
    real = store.claim

    def unreachable(*args: object, **kwargs: object) -> store.Outcome:
        raise OSError("disk I/O error")

    monkeypatch.setattr(store, "claim", unreachable)
    clock.advance(RENEW_S)
    assert east.renew() is None
    assert east.refusal("big", "restart the server") is None  # a lapse is still far off
    clock.advance(LEASE_S - 2 * RENEW_S)
    assert east.renew() is None
    text = east.refusal("big", "restart the server")
    assert text is not None
    assert "cannot restart the server on `big`: this bot could not renew its claims" in text
    assert "for 90 s" in text and "claims.db" in text
    monkeypatch.setattr(store, "claim", real)
    assert east.renew() is not None
    assert east.refusal("big", "restart the server") is None
    east.stop()


def test_a_bot_whose_name_another_bot_took_refuses_every_change(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its claims released by force, and another bot started under the same name with another
    database (on another host, say): the claims are that bot's now, so this one changes none
    of its servers, and says so."""
    clock = Clock()
    east_config = bot_config(tmp_path, "east", {"big": URL})
    east = ClaimKeeper(east_config, now=clock)
    east.take()
    assert east_config.claims is not None
    store.release_bot(store.open_claims(east_config.claims.path), "east")
    again = tmp_path / "again.toml"  # the same name, its own database, the same claims file
    again.write_text(
        f'[kvpilot]\ndatabase = "again/kvpilot.db"\nclaims = "claims.db"\nbot_name = "east"\n'
        f'[servers.big]\nurl = "{URL}"\n'
    )
    ClaimKeeper(load(str(again)), now=clock).take()
    with caplog.at_level("ERROR"):
        east.renew()
    text = east.refusal("big", "restart the server")
    assert text is not None and 'bot name "east" is in use' in text, text
    assert any("another database" in r.getMessage() for r in caplog.records)
    east.stop()
