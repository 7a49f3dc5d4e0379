"""`kvpilot doctor`: every check a first start needs, each with its fix; writes nothing.

One line per check, so the first thing wrong is on the screen with what to do about it:
the configuration, the database's path, the estate's claims file where one is shared (no other
live bot holds this configuration's servers), Slack (the token, the scopes of
deploy/slack/manifest.yaml, the user groups the access policy names), and each server (it
answers, the API key, its engine and version, its metrics, through Prometheus where
configured), and what its launcher will need to restart it (the program; the Docker socket and
container; the unit, its drop-in and the rights to restart it; a Kubernetes access review).
Exit status 1 when any check fails.
"""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from sqlite_utils import Database

from bot.app.checks import Check
from bot.app.config import ConfigError, load
from bot.app.config.loading import Config
from bot.app.config.servers import ServerConfig
from bot.cli.chat import CHAT_IDS
from playbooks.clock import WallClock
from playbooks.launchers.base import LaunchError
from playbooks.launchers.common import writable_ancestor


def run_checks(config_path: str | None, env: Mapping[str, str]) -> Iterator[Check]:
    """Every check in order; a configuration that does not load ends the list."""
    try:
        config = load(config_path, ids=CHAT_IDS)
    except ConfigError as exc:
        yield Check(
            "config", False, str(exc), "edit the key named above (docs/configuration.md)", True
        )
        return
    yield Check("config", True, f"{config.path}: {len(config.servers)} server(s)")
    yield from checks_of(config, env)


def checks_of(config: Config, env: Mapping[str, str]) -> Iterator[Check]:
    """What a loaded configuration needs: the database, Slack, each server and launcher."""
    yield database_check(config.database)
    if config.claims is not None:
        yield claims_check(config)
    from bot.slack.doctor import slack_checks  # noqa: PLC0415 - Slack loads only here

    yield from slack_checks(config, env)

    def of_server(server: ServerConfig) -> list[Check]:
        return [*server_checks(server, config.time_scale), *launcher_checks(config, server)]

    # a server that does not answer costs its timeout: many are looked at side by side
    with ThreadPoolExecutor(max_workers=8) as pool:
        for found in pool.map(of_server, config.servers.values()):
            yield from found


def database_check(path: Path) -> Check:
    """The database opens read-only, or its directory could be created and written.

    Permission bits are not the answer (root passes every one, also under /proc or on a
    read-only mount): a file is created in the directory the database would go in, then
    removed, so what is judged is what SQLite will meet."""
    fix = "set [kvpilot] database to a file in a directory kvpilot can write"
    if path.is_dir():
        return Check(
            "database", False, f"{path} is a directory", f"name a file in it: {path}/kvpilot.db",
            True,
        )  # fmt: skip
    if path.exists():
        try:
            conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
            try:
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            finally:
                conn.close()
        except sqlite3.DatabaseError as exc:
            return Check("database", False, f"{path} cannot be read: {exc}", fix, True)
        if not os.access(path, os.W_OK):
            return Check("database", False, f"{path} is read-only for this user", fix, True)
    where = path.parent if path.exists() else writable_ancestor(path.parent)
    cannot = "cannot be written" if path.exists() else "cannot be created"
    if where is None:
        return Check("database", False, f"{path} {cannot}: not writable here", fix, True)
    try:
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError as exc:
        return Check("database", False, f"{path} {cannot}: {exc.strerror} in {where}", fix, True)
    return Check(
        "database",
        True,
        f"{path} opens" if path.exists() else f"{path} will be created on first use",
    )


def claims_check(config: Config) -> Check:
    """`[kvpilot] claims`: the shared file can be written, and no other live bot holds a server
    of this configuration (what would refuse the start). Reads only."""
    from bot.app.claims import LEASE_S, ago  # noqa: PLC0415
    from bot.app.config.estate import claim_keys  # noqa: PLC0415
    from storage import claims as store  # noqa: PLC0415

    assert config.claims is not None
    path, name = config.claims.path, config.claims.bot_name
    fix = "set [kvpilot] claims to a file every bot of the estate can write (docs/operations.md)"
    where = path.parent if path.exists() else writable_ancestor(path.parent)
    if where is None or (path.exists() and not os.access(path, os.W_OK)):
        return Check("claims", False, f"{path} cannot be written by this user", fix, True)
    if not path.exists():
        return Check("claims", True, f"{path} will be created at the first start; bot {name!r}")
    keys = claim_keys(list(config.servers.values()))
    now = datetime.now(UTC)
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            held = [
                c
                for c in store.all_claims(Database(conn))
                if c.url in keys and c.bot != name and c.holder.live(now, LEASE_S)
            ]
            mine = store.holder_of(Database(conn), name)
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        return Check("claims", False, f"{path} cannot be read: {exc}", fix, True)
    if held:
        listing = "; ".join(
            f'{keys[c.url]} ({c.url}) by bot "{c.bot}" (host {c.holder.host}, pid '
            f"{c.holder.pid}, {ago(c.holder.age_s(now))})"
            for c in held
        )
        running = mine is not None and mine.live(now, LEASE_S)
        return Check(
            "claims",
            False,
            # a running bot of this name lost them (released by force, then taken)
            f"held by another live bot: bot {name!r}, running, has lost them and no longer "
            f"changes them (its /healthz lists them under claims_lost): {listing}"
            if running
            else f"held by another live bot, so the start would be refused: {listing}",
            "remove these servers from one of the two configurations; for a bot gone for good, "
            "`kvpilot claims release BOT`",
        )
    return Check("claims", True, f"{path}: no server of bot {name!r} is held by another live bot")


def server_checks(server: ServerConfig, time_scale: float = 1.0) -> Iterator[Check]:
    from bot.app.wiring import engine_client  # noqa: PLC0415 - engines load only here
    from playbooks.engines.base import (  # noqa: PLC0415
        EngineError,
        MetricsDisabled,
        Unauthorized,
        WrongEngine,
    )

    area = f"server {server.name}"
    client = engine_client(server, timeout_s=5.0, attempts=1)
    try:
        try:
            settings = client.settings()
            version = settings.version
            # what the settings could read without a key; the model's info needs it
            client.model_info()
        except Unauthorized as exc:
            fix = exc.hint or "set api_key (or api_key_env) in [servers.NAME]"
            yield Check(area, False, without(str(exc), fix), fix)
            return
        except WrongEngine as exc:
            yield wrong_engine(server, exc)
            return
        except EngineError as exc:
            yield Check(area, False, str(exc), down_fix(server))
            return
        yield Check(area, True, f"{server.url} answers: {client.engine.label} {version}")
        yield from time_scale_check(area, settings, time_scale)
        try:
            client.metrics()
            yield Check(area, True, f"metrics: {client.describe_metrics()}")
        except MetricsDisabled as exc:
            yield Check(area, False, without(str(exc), exc.hint), exc.hint)
        except EngineError as exc:
            yield Check(area, False, f"metrics: {without(str(exc), exc.hint)}", exc.hint)
    finally:
        client.close()


def time_scale_check(area: str, settings: Any, configured: float) -> Iterator[Check]:
    """A server that runs faster than real time (kvpilot's twin) needs the same time scale in
    the configuration: kvpilot reads rates on its own clock, which would make each of them that
    many times too high."""
    from playbooks.engines import announced_time_scale  # noqa: PLC0415

    announced = announced_time_scale(settings)
    if announced is None or abs(announced - configured) < 1e-9:
        return
    yield Check(
        area,
        False,
        f"it runs {announced:g} times faster than real time (kvpilot's twin) and [kvpilot] "
        f"time_scale is {configured:g}: every rate kvpilot read would be "
        f"{announced / configured:g} times off",
        f"set time_scale = {announced:g} in [kvpilot]",
    )


def wrong_engine(server: ServerConfig, exc: Exception) -> Check:
    """The configured engine does not answer there: which one does, and the key to set."""
    from playbooks.engines import detect  # noqa: PLC0415 - engines load only here
    from playbooks.engines.base import EngineError  # noqa: PLC0415

    area = f"server {server.name}"
    try:
        client = detect(server.url, api_key=server.api_key, timeout_s=5.0)
    except EngineError:
        return Check(area, False, str(exc), down_fix(server))
    try:
        version = client.settings().version
    finally:
        client.close()
    return Check(
        area,
        False,
        f"this is {client.engine.label} {version} at {server.url}, not {server.engine}",
        f'set engine = "{client.engine.name}" in [servers.{server.name}]',
    )


def without(message: str, fix: str) -> str:
    """The message without the fix it ends with: doctor prints the fix on a line of its own."""
    if fix and message.endswith(fix):
        return message[: -len(fix)].rstrip(" .(") or message
    return message


def launcher_checks(config: Config, server: ServerConfig) -> Iterator[Check]:
    """What the server's launcher will need to restart it, looked at without changing it."""
    if server.launcher is None:
        return
    from bot.app.wiring import launcher  # noqa: PLC0415 - launchers load only here

    area = f"server {server.name}"
    kind = server.launcher.kind
    try:
        findings = launcher(config, server, WallClock()).permissions()
    except (LaunchError, ConfigError) as exc:
        yield Check(area, False, f"{kind} launcher: {exc}", "")
        return
    for f in findings:
        yield Check(area, f.ok, f"{kind} launcher: {f.detail}", f.fix)


def down_fix(server: ServerConfig) -> str:
    if server.launcher is not None:
        return f"start it: kvpilot server start --server {server.name}"
    return "check the url in [servers.NAME] and that the server runs"


def doctor(config_path: str | None, out: TextIO, *, as_json: bool, env: Mapping[str, str]) -> int:
    checks = list(run_checks(config_path, env))
    failed = [c for c in checks if not c.ok]
    if as_json:
        out.write(json.dumps({"ok": not failed, "checks": [asdict(c) for c in checks]}) + "\n")
    else:
        for c in checks:
            mark = "ok  " if c.ok else "FAIL"
            line = f"{mark} {c.area}: {c.detail}"
            out.write(line + (f"\n     fix: {c.fix}" if c.fix and not c.ok else "") + "\n")
        out.write(
            f"{len(checks) - len(failed)} of {len(checks)} checks passed"
            + ("" if not failed else f"; {len(failed)} failed")
            + "\n"
        )
    return 1 if failed else 0
