"""A bot's claims on its servers while it runs (`[kvpilot] claims`; storage in `storage/claims.py`).

When several bots split one estate, each claims every server of its configuration before it
starts anything (the sampler, resumed experiments, the schedules); a server another live bot
holds refuses the start with a message saying who holds it and how to fix it. The claims are
renewed every `RENEW_S` while the bot runs and released at its clean stop. One-shot commands
that change a server (`experiment`, `tune`, `rollout`, `resume`, `server start|stop`) claim the
same way for as long as they run (`held`).

A running bot whose claim another operator released by force (`kvpilot claims release BOT
--force`), and that another bot then took, has lost that server (`ClaimKeeper.lost`): from the
next renewal on it refuses every action that changes the server (`lost_refusal`: experiment
steps, restarts, rollouts, proposals, approvals, aborts) and keeps only reading it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime

from bot.app.config import Config, ConfigError
from bot.app.config.estate import claim_keys
from storage import claims as store

log = logging.getLogger(__name__)
LEASE_S = store.LEASE_S
RENEW_S = LEASE_S / 4  # three renewals may fail before the lease lapses
# unrenewed this long, a bot changes nothing more: another may take its servers at LEASE_S
STALE_S = LEASE_S - 2 * RENEW_S


class ClaimRefused(ConfigError):
    """Another live bot holds one of this configuration's servers: the message says which,
    who holds it and how to fix it."""


def process_of(config: Config) -> store.Process:
    """This process as the claims file records it."""
    assert config.claims is not None
    name = config.claims.bot_name
    return store.Process(name, socket.gethostname(), os.getpid(), os.path.abspath(config.database))


def ago(seconds: float | None) -> str:
    if seconds is None:
        return "never renewed"
    return f"last renewed {max(0.0, seconds):.0f} s ago"


def name_taken_reason(config: Config, other: store.Holder, now: datetime) -> str:
    """Another live bot holds claims under this bot's name, with another database."""
    assert config.claims is not None
    return (
        f'bot name "{config.claims.bot_name}" is in use in the claims file '
        f"{config.claims.path} by a live bot with another database ({other.database}, host "
        f"{other.host}, pid {other.pid}, {ago(other.age_s(now))}); give each bot of the estate "
        f"its own [kvpilot] bot_name in {config.path}"
    )


def refusal(config: Config, outcome: store.Outcome, doing: str, now: datetime) -> str:
    """Why `doing` may not go on, naming each server in conflict, its holder and the fixes."""
    assert config.claims is not None
    me, where = config.claims.bot_name, config.claims.path
    if outcome.name_taken is not None:
        return f"cannot {doing}: " + name_taken_reason(config, outcome.name_taken, now)
    lines = [
        f'cannot {doing}: bot "{me}" ({config.path}) would own {len(outcome.conflicts)} '
        f"server(s) that another live bot holds in the claims file {where}:"
    ]
    holders = {}
    for c in outcome.conflicts:
        h = c.theirs.holder
        holders[h.bot] = h
        theirs = "" if c.theirs.server == c.server else f', which it calls "{c.theirs.server}"'
        lines.append(
            f'  - {c.server} ({c.url}) is held by bot "{h.bot}"{theirs} (host {h.host}, '
            f"pid {h.pid}), {ago(h.age_s(now))}"
        )
    bots = ", ".join(f'"{b}"' for b in holders)
    release = " or ".join(f"`kvpilot claims release {b} --config {config.path}`" for b in holders)
    lines.append(
        "Fix: remove each of these servers from one of the two configurations (two bots must "
        f"never both restart, tune or sample a server); or, if bot {bots} is gone for good, "
        f"wait until its lease lapses ({LEASE_S:.0f} s after its last renewal) or run {release}."
    )
    return "\n".join(lines)


def lost_refusal(
    server: str, url: str, lost: Mapping[str, str], doing: str, config_path: str
) -> str | None:
    """Why this bot may not `doing` on `server` (whose normalised URL is `url`): another bot
    took its claim while this one ran (`lost`: URL -> that bot); None when it may."""
    holder = lost.get(url)
    if holder is None:
        return None
    return (
        f'cannot {doing} on `{server}`: bot "{holder}" holds its claim now (this bot\'s claim '
        f"was released by force while it ran), so this bot no longer changes it. Fix: remove "
        f"[servers.{server}] from {config_path} and restart this bot; or release it from bot "
        f'"{holder}" (remove it from that bot\'s configuration and restart it), then restart '
        "this bot to claim it again"
    )


class ClaimKeeper:
    """This process's claims: taken at once (`take`), renewed by a thread, released at stop.

    `now` is the wall clock (a bot on an accelerated twin's clock still renews in real
    seconds, which is what every other bot of the estate reads); tests pass their own."""

    def __init__(
        self,
        config: Config,
        *,
        servers: list[str] | None = None,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        renew_s: float = RENEW_S,
    ) -> None:
        assert config.claims is not None
        self.config = config
        names = list(config.servers) if servers is None else servers
        self.keys = claim_keys([config.servers[n] for n in names])
        self.me = process_of(config)
        self.now = now
        self.renew_s = renew_s
        self.held = False
        self.lost: dict[str, str] = {}  # url -> the bot that took it from us
        self.renewed_at: datetime | None = None  # the last claim or renewal that succeeded
        self.name_taken: store.Holder | None = None  # our name, another live bot's now
        self.urls = {n: url for url, names in self.keys.items() for n in names.split(", ")}
        self._db = store.open_claims(config.claims.path)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def of(cls, config: Config, servers: list[str] | None = None) -> ClaimKeeper | None:
        """The keeper for `config`, or None when it names no claims file (one bot)."""
        return None if config.claims is None else cls(config, servers=servers)

    def take(self, doing: str = "start this bot") -> None:
        """Claim every server, or none and raise ClaimRefused."""
        now = self.now()
        with self._lock:
            outcome = store.claim(self._db, self.me, self.keys, now=now, lease_s=LEASE_S)
        if outcome.refused:
            raise ClaimRefused(refusal(self.config, outcome, doing, now))
        self.held = True
        self.renewed_at = now
        for old in outcome.taken_over:
            log.warning(
                'took over %s (%s) from bot "%s" (host %s, pid %s), whose lease lapsed: %s',
                old.server, old.url, old.bot, old.holder.host, old.holder.pid,
                ago(old.holder.age_s(now)),
            )  # fmt: skip
        log.info(
            'bot "%s" claims %d server(s) in %s',
            self.me.bot, len(self.keys), self.config.claims.path if self.config.claims else "",
        )  # fmt: skip

    def refusal(self, server: str, doing: str) -> str | None:
        """Why this bot may not `doing` on `server` now (`lost_refusal`); None when it may."""
        url = self.urls.get(server)
        if url is None:  # not one of ours to claim (a one-shot command's other servers)
            return None
        claims = self.config.claims.path if self.config.claims else ""
        if self.name_taken is not None:
            return f"cannot {doing} on `{server}`: " + name_taken_reason(
                self.config, self.name_taken, self.now()
            )
        unrenewed = None if self.renewed_at is None else (self.now() - self.renewed_at)
        if self.held and unrenewed is not None and unrenewed.total_seconds() > STALE_S:
            return (
                f"cannot {doing} on `{server}`: this bot could not renew its claims in {claims} "
                f"for {unrenewed.total_seconds():.0f} s, and another bot may take its servers "
                f"once its lease lapses ({LEASE_S:.0f} s), so it changes none until a renewal "
                "succeeds. Fix: make the claims file reachable and writable from this host "
                "(the log says why each renewal failed)"
            )
        # one look-up in `lost`, which the renewal thread only adds to
        return lost_refusal(server, url, self.lost, doing, str(self.config.path))

    def lost_view(self) -> list[dict[str, str]]:
        """The servers lost to another bot, for /healthz."""
        return [
            {"server": n, "url": url, "held_by": bot}
            for n, url in self.urls.items()
            if (bot := self.lost.get(url)) is not None
        ]

    def renew(self) -> store.Outcome | None:
        """One renewal: the heartbeat, and any claim of ours released meanwhile taken back. A
        server another bot holds now (our claims were released by force) is lost: logged, and
        refused from then on to every action that would change it (`refusal`)."""
        now = self.now()
        try:
            with self._lock:
                outcome = store.claim(self._db, self.me, self.keys, now=now, lease_s=LEASE_S)
        except Exception as exc:  # the shared file unreachable: try again at the next renewal
            path = self.config.claims.path if self.config.claims else ""
            log.warning("renewing the claims in %s failed: %s", path, exc)
            return None
        if outcome.name_taken is not None:
            if self.name_taken is None:
                log.error(
                    "%s: this bot changes none of its servers from now on",
                    name_taken_reason(self.config, outcome.name_taken, now),
                )
            self.name_taken = outcome.name_taken
            return outcome
        self.renewed_at = now
        if outcome.refused:
            for c in outcome.conflicts:
                self.lost[c.url] = c.theirs.bot
                del self.keys[c.url]
                log.error(
                    'lost the claim on %s (%s) to bot "%s": this bot no longer changes it (its '
                    "experiments there are left as they stand); remove it from one of the two "
                    "configurations and restart this bot",
                    c.server, c.url, c.theirs.bot,
                )  # fmt: skip
            with self._lock:  # keep the heartbeat and the rest of the claims
                store.claim(self._db, self.me, self.keys, now=now, lease_s=LEASE_S)
        return outcome

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="kvpilot-claims", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.renew_s):
            self.renew()

    def stop(self) -> int:
        """The clean stop: renewals end and the claims go (unless another process of this bot
        still runs). Returns the claims released."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if not self.held:
            self._db.close()
            return 0
        self.held = False
        try:
            with self._lock:
                released = store.release_process(self._db, self.me, now=self.now())
        except Exception as exc:  # the lease lapses by itself
            log.warning("releasing the claims failed (they lapse in %.0f s): %s", LEASE_S, exc)
            released = 0
        self._db.close()
        return released


@contextmanager
def held(config: Config, doing: str, servers: list[str] | None = None) -> Iterator[None]:
    """The claims a one-shot command that changes servers holds while it runs: `servers`, or
    every configured server when None (none without `[kvpilot] claims`, or for `[]`);
    ClaimRefused when another live bot holds one of them."""
    keeper = None if servers == [] else ClaimKeeper.of(config, servers=servers)
    if keeper is None:
        yield
        return
    try:
        keeper.take(doing)
        keeper.start()
        yield
    finally:
        keeper.stop()
