"""The metrics sampler: every configured server, every ``interval_s``, into storage.

While the bot runs it reads each server's metrics (or its load report when metrics are
off), turns counters into increases, and stores one raw sample per server per tick. What it
cannot observe is stored as a gap, never as zeros: a failed scrape opens a ``down`` gap that
the next good scrape closes (noting whether the server restarted: its counters went back), a
counter reset between two good scrapes is a ``restart`` gap, and time the sampler itself was
not running is ``no_data``. Every few minutes it rolls samples up and drops what is past
retention (``storage.metric_samples.compact``), so a year of samples stays a few megabytes.

Each good scrape's full snapshot is also stored as a ``monitor`` sample (``storage.samples``,
``t`` in epoch seconds), kept ``monitor_retention`` (2 hours by default): an approved experiment
takes a recent, uninterrupted stretch of them as its baseline instead of measuring one
(``playbooks.experiments.known_baseline``).

The server's own settings (server info) are read when it is first seen and after every gap,
and stored when they changed, for the report's "configuration now versus a day ago".

Servers whose metrics come from the same Prometheus are read with one query a round
(`bot.reports.sampler_prometheus`) rather than two each. A round scrapes up to
`[sampler] concurrency` servers at once (16 by default; each has its own
client), so a round over a fleet of hundreds takes about the slowest scrapes' time rather than
the sum of every server's; what was read is stored afterwards in the sampler's thread, one
server after another in the configured order, on its one database connection, in one
transaction for the whole round: a commit per server per tick cost a fleet's bot most of its
storing time, and the round's raw and monitor samples go in as one `executemany` each. A round
that fails to store stores nothing; the next round reads back what is stored (`_prepare`).

Time comes from the process's one ``Clock`` (``bot.app.wiring.make_clock``): the wall clock in
production, a scaled one against a twin started with ``--time-scale K`` (so samples are in the
twin's time, on the same time line as experiments and reports), a manual one in tests.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TypeVar

from sqlite_utils import Database

from bot.app.config import Config, ServerConfig
from bot.app.wiring import engine_client
from bot.reports.sampler_prometheus import grouped_scrapes
from bot.reports.sampler_state import SamplerStatus, ServerState
from playbooks.clock import Clock
from playbooks.engines.base import (
    EngineClient,
    EngineError,
    MetricsDisabled,
    ServerSettings,
    Snapshot,
)
from storage.db import database_path, open_db, write_transaction
from storage.metric_buckets import RawSample
from storage.metric_samples import (
    Gap,
    add_gap,
    close_gap,
    compact,
    extend_gap,
    last_sample,
    open_gap,
)
from storage.metric_samples import add_samples as add_raw_samples
from storage.samples import Sample, add_samples, prune_monitor_samples
from storage.server_snapshots import record_snapshot

log = logging.getLogger(__name__)

_R = TypeVar("_R")
CONTIGUOUS_FACTOR = 2.5  # a sample stands for at most this many intervals of time
COMPACT_EVERY_S = 300.0


# stored counter column -> the snapshot's counter, and the increase column it feeds
_COUNTERS = (
    ("gen_total", "generated_tokens", "gen_tokens"),
    ("prompt_total", "prompt_tokens", "prompt_tokens"),
    ("requests_total", "completed_requests", "requests"),
    ("retractions_total", "preemptions", "retractions"),
)
_INCREASES = tuple(inc for _, _, inc in _COUNTERS)


def counters_reset(prev: RawSample, now: Snapshot) -> bool:
    """Whether any counter went back: the server process was restarted."""
    for column, counter, _ in _COUNTERS:
        before, after = getattr(prev, column), getattr(now, counter)
        if before is not None and after is not None and after < before:
            return True
    return False


def increases(prev: RawSample | None, now: Snapshot, reset: bool) -> dict[str, float | None]:
    """Counter increases since ``prev``; after a reset the new value is the increase."""
    out: dict[str, float | None] = {}
    for column, counter, inc in _COUNTERS:
        after = getattr(now, counter)
        before = None if prev is None else getattr(prev, column)
        if after is None or before is None:
            out[inc] = None
        else:
            out[inc] = after if reset else after - before
    return out


@dataclass(frozen=True)
class Outcome:
    server: str
    ok: bool
    error: str = ""


ClientFactory = Callable[[ServerConfig], EngineClient]


def default_client(
    server: ServerConfig, timeout_s: float = 5.0, clock: Clock | None = None
) -> EngineClient:
    """The server's client for sampling, with its configured metrics source (the server's own
    metrics endpoint or Prometheus). One quick retry: a failed scrape is simply tried next tick.
    A client lives as long as the sampler, so an engine that exports its decode rate only as a
    counter (vLLM) has a rate from the second tick on, timed on the sampler's `clock`."""
    return engine_client(server, timeout_s=timeout_s, attempts=2, wait=lambda *_: 0.1, clock=clock)


@dataclass
class _Rows:
    """A round's samples, stored together at its end."""

    raw: list[RawSample] = field(default_factory=list)
    monitor: list[Sample] = field(default_factory=list)

    def store(self, db: Database) -> None:
        add_raw_samples(db, self.raw)
        add_samples(db, self.monitor)


@dataclass
class _Loop:
    thread: threading.Thread
    stop: threading.Event = field(default_factory=threading.Event)


class Sampler(SamplerStatus):
    """Samples every configured server into the database; ``start()`` runs it in a thread."""

    def __init__(
        self,
        config: Config,
        db: Database,
        clock: Clock,
        *,
        client_factory: ClientFactory | None = None,
    ) -> None:
        super().__init__(config, clock)
        self.db = db
        self.monitor_retention_s = config.sampler.monitor_retention_s
        self._client_factory = client_factory or (lambda s: default_client(s, clock=clock))
        self._clients: dict[str, EngineClient] = {}
        self.db_path = database_path(db)  # the thread opens its own connection to it
        self._loop: _Loop | None = None
        self._lock = threading.Lock()
        self._last_compact: datetime | None = None
        self.on_round: Callable[[], None] | None = None  # after each round (its own process)

    # ------------------------------------------------------------------ one tick
    def sample_once(self, db: Database | None = None) -> list[Outcome]:
        """Scrape every server once and store what was seen; returns one outcome per server."""
        db = db or self.db
        with self._lock:
            names = list(self.config.servers)
            for name in names:
                self._prepare(db, name)
                self._client(name)  # made here: the scrapes run in other threads
            readings = self._read_all(names)
            rows = _Rows()
            with write_transaction(db):  # the whole round's rows: one commit
                for name in names:  # what another process stored since `_prepare`
                    self._build_on_stored(db, self.states[name])
                outcomes = [self._store(db, name, readings[name], rows) for name in names]
                rows.store(db)
            wanted = [n for n, o in zip(names, outcomes, strict=True) if o.ok]
            wanted = [n for n in wanted if self.states[n].need_snapshot]
            for name, info in self._fetch_all(wanted, self._settings).items():
                self._snapshot(db, self.states[name], info)
            return outcomes

    def _read_all(self, names: list[str]) -> dict[str, tuple[datetime, Snapshot | Exception]]:
        """Every server's reading: those sharing a Prometheus with one query a batch
        (`bot.reports.sampler_prometheus`), the others each on its own."""
        together: dict[str, tuple[datetime, Snapshot | Exception]] = {}
        if self.config.sampler.prometheus_batch:
            clients = {name: self._clients[name] for name in names}
            together = grouped_scrapes(clients, self.clock.utcnow, self._fetch_all)
        alone = self._fetch_all([n for n in names if n not in together], self._scrape)
        return alone | together

    def _fetch_all(self, names: list[str], read: Callable[[str], _R]) -> dict[str, _R]:
        """`read` of every server, at most `[sampler] concurrency` at once."""
        workers = min(self.config.sampler.concurrency, len(names))
        if workers <= 1:
            return {name: read(name) for name in names}
        with ThreadPoolExecutor(workers, thread_name_prefix="kvpilot-scrape") as pool:
            return dict(zip(names, pool.map(read, names), strict=True))

    def compact(self, db: Database | None = None) -> None:
        """Roll up and expire samples now."""
        db = db or self.db
        now = self.clock.utcnow()
        compact(db, now.timestamp(), self.retention, settle_s=2 * self.interval_s)
        prune_monitor_samples(db, now.timestamp() - self.monitor_retention_s)
        self._last_compact = now

    def _client(self, name: str) -> EngineClient:
        if name not in self._clients:
            self._clients[name] = self._client_factory(self.config.servers[name])
        return self._clients[name]

    def _read(self, client: EngineClient) -> Snapshot:
        try:
            return client.snapshot()
        except MetricsDisabled:
            return client.load_snapshot()

    def _prepare(self, db: Database, name: str) -> None:
        state = self.states[name]
        if not state.loaded:
            self._first_contact(db, state, self.clock.utcnow().timestamp())

    @staticmethod
    def _build_on_stored(db: Database, state: ServerState) -> None:
        """Another bot process may share the database (`serve` and a `console`): the round
        builds on what is stored, read in the transaction that stores it, so that two samplers
        interleave instead of counting the same tokens twice (a reading older than the stored
        one is not stored)."""
        state.last = last_sample(db, state.name)
        state.gap = open_gap(db, state.name)

    def _scrape(self, name: str) -> tuple[datetime, Snapshot | Exception]:
        """One server's reading and when it was taken; what went wrong, as the exception."""
        now = self.clock.utcnow()
        try:
            return now, self._read(self._clients[name])
        except Exception as exc:  # stored as a failed scrape by _store
            return now, exc

    def _store(
        self, db: Database, name: str, scraped: tuple[datetime, Snapshot | Exception], rows: _Rows
    ) -> Outcome:
        state = self.states[name]
        now, reading = scraped
        t = now.timestamp()
        state.last_attempt = now
        if isinstance(reading, EngineError):
            self._failed(db, state, t, str(reading))
            return Outcome(name, False, str(reading))
        if isinstance(reading, Exception):  # a bug or a malformed answer: not the sampler's end
            log.error("sampling %s failed", name, exc_info=reading)
            self._failed(db, state, t, f"{type(reading).__name__}: {reading}")
            return Outcome(name, False, str(reading))
        self._succeeded(db, state, now, reading, rows)
        return Outcome(name, True)

    def _max_gap(self) -> float:
        return CONTIGUOUS_FACTOR * self.interval_s

    def _first_contact(self, db: Database, state: ServerState, t: float) -> None:
        """Pick up where an earlier run left off; note if it stopped long enough ago that the
        time in between is unknown (the sampler was not running)."""
        state.loaded = True
        state.last = last_sample(db, state.name)
        state.gap = open_gap(db, state.name)
        seen = [x for x in (state.last and state.last.ts, state.gap and state.gap.end_ts) if x]
        if seen and t - max(seen) > self._max_gap():
            state.away_since = max(seen)

    def _end_absence(self, db: Database, state: ServerState, t: float, restarted: bool) -> None:
        assert state.away_since is not None
        if state.gap is not None:  # down when the earlier run stopped; for how long is unknown
            close_gap(db, state.gap.id, state.gap.end_ts, restarted=False)
            state.gap = None
        add_gap(
            db,
            state.name,
            "no_data",
            state.away_since,
            t,
            restarted=restarted,
            detail="sampler not running",
        )
        state.away_since = None

    def _failed(self, db: Database, state: ServerState, t: float, error: str) -> None:
        state.last_error = error
        state.failures += 1
        if state.away_since is not None:
            self._end_absence(db, state, t, restarted=False)
        gap = state.gap
        if gap is None:
            gap_id = add_gap(db, state.name, "down", t, t, open=True, detail=error)
            state.gap = Gap(gap_id, state.name, "down", t, t, True, False, error)
            return
        extend_gap(db, gap.id, t, detail=error)
        state.gap = Gap(gap.id, gap.server, gap.kind, gap.start_ts, t, True, False, error)

    def _succeeded(
        self, db: Database, state: ServerState, now: datetime, r: Snapshot, rows: _Rows
    ) -> None:
        t = now.timestamp()
        last = state.last
        if last is not None and t <= last.ts:
            log.warning(
                "a later sample of %s is stored already (another sampler on this database, or "
                "the clock went back): this reading (%.3f <= %.3f) is not stored",
                state.name, t, last.ts,
            )  # fmt: skip
            return
        reset = last is not None and counters_reset(last, r)
        continuous = last is not None and not reset
        counted = last is not None
        if state.away_since is not None:
            self._end_absence(db, state, t, restarted=reset)
            continuous = counted = False
            state.need_snapshot = True
        elif state.gap is not None:
            close_gap(db, state.gap.id, t, restarted=reset)
            state.gap = None
            continuous = False
            state.need_snapshot = True
        elif reset and last is not None:
            add_gap(db, state.name, "restart", last.ts, t, restarted=True)
            state.need_snapshot = True
        dt = t - last.ts if continuous and last is not None else None
        inc: dict[str, float | None] = (
            increases(last, r, reset) if counted else dict.fromkeys(_INCREASES)
        )
        sample = RawSample(
            server=state.name,
            ts=t,
            span_s=self.interval_s if dt is None else min(dt, self._max_gap()),
            dt=dt,
            gen_total=r.generated_tokens,
            prompt_total=r.prompt_tokens,
            requests_total=r.completed_requests,
            retractions_total=r.preemptions,
            decode_rate=r.decode_rate,
            running=r.running,
            queued=r.queued,
            token_usage=r.kv_usage,
            retracted=r.preempting,
            max_total_tokens=r.capacity_tokens or state.capacity,
            **inc,
        )
        rows.raw.append(sample)
        # the full snapshot too, for an experiment's baseline: one row per server per tick
        rows.monitor.append(Sample(state.name, "monitor", t, now, r.at(t).to_json()))
        state.last = sample
        state.last_error = ""
        state.samples += 1

    def _settings(self, name: str) -> tuple[float, ServerSettings | EngineError]:
        t = self.clock.utcnow().timestamp()
        try:
            return t, self._clients[name].settings()
        except EngineError as exc:
            return t, exc

    def _snapshot(
        self, db: Database, state: ServerState, read: tuple[float, ServerSettings | EngineError]
    ) -> None:
        t, info = read
        if isinstance(info, EngineError):
            log.info("server info of %s not read (%s); trying next tick", state.name, info)
            return
        state.capacity = info.capacity_tokens
        settings = self._client(state.name).engine.stored_settings(info.raw)
        record_snapshot(db, state.name, t, settings)
        state.need_snapshot = False

    # ------------------------------------------------------------------ the thread
    def start(self) -> None:
        """Sample in a daemon thread until ``stop()``; it uses its own database connection.
        Does nothing when ``[sampler] enabled = false``."""
        if self._loop is not None or not self.config.sampler.enabled:
            return
        path = self.db_path
        if path is None:
            raise RuntimeError(
                "the sampler's thread needs a database file (kvpilot.database), not an "
                "in-memory database; call sample_once() instead"
            )
        loop = _Loop(threading.Thread(target=self._run, args=(path,), name="kvpilot-sampler"))
        loop.thread.daemon = True
        self._loop = loop
        self.started_mono = time.monotonic()
        loop.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread (within one scrape) and close the clients."""
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.stop.set()
            loop.thread.join(timeout)
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    @property
    def running(self) -> bool:
        return self._loop is not None and self._loop.thread.is_alive()

    def _run(self, path: Path) -> None:
        loop = self._loop
        assert loop is not None
        db = open_db(path)
        try:
            due = self.clock.utcnow()
            while not loop.stop.is_set():
                try:
                    self.sample_once(db)
                    last = self._last_compact
                    now = self.clock.utcnow()
                    if last is None or (now - last).total_seconds() >= COMPACT_EVERY_S:
                        self.compact(db)
                except Exception:  # the database may be locked for a moment; keep sampling
                    log.exception("sampling round failed")
                else:
                    self.last_round_mono = time.monotonic()
                    if self.on_round is not None:
                        self.on_round()
                due += timedelta(seconds=self.interval_s)
                now = self.clock.utcnow()
                due = max(due, now)  # fell behind (slow scrapes): skip, do not burst
                loop.stop.wait(self.clock.wall_seconds((due - now).total_seconds()))
        finally:
            db.close()
