"""The audit log: typed events, one recorder, read back in order.

Every change the bot makes is one event. Events are frozen dataclasses so that a call site
names its fields and mypy checks them; the log stores the event's name, actor and time in
columns and its other fields as JSON, with ``server`` and ``experiment_id`` copied into
columns so that "what happened to this server / experiment" is an indexed query. Tests assert
on these events rather than on log lines. SQLite triggers (migration 1) make the table
append-only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from sqlite_utils import Database

from storage._codec import dumps, loads, utc_iso

JSON = dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class AuditEvent:
    """Base of every event: who did it and when. ``name`` is the kind, fixed per class."""

    name: ClassVar[str] = ""
    actor: str
    created: datetime

    def properties(self) -> JSON:
        """The event's own fields, without actor and time."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del values["actor"], values["created"]
        return values


@dataclass(frozen=True, kw_only=True)
class ServerRegistered(AuditEvent):
    """A server was added to (or its address changed in) the bot's inventory."""

    name: ClassVar[str] = "server_registered"
    server: str
    url: str
    launcher_kind: str


@dataclass(frozen=True, kw_only=True)
class ConfigApplied(AuditEvent):
    """A launch configuration was recorded as the one the server now runs."""

    name: ClassVar[str] = "config_applied"
    server: str
    config_id: int
    args: JSON
    experiment_id: int | None = None
    note: str | None = None


@dataclass(frozen=True, kw_only=True)
class ConfigChangedOutside(AuditEvent):
    """The server ran arguments kvpilot had not set (someone changed it by hand): kvpilot
    recorded them as applied and last-known-good (``config_id``) and did not touch the server.

    ``recorded_args`` is what kvpilot's history said the server ran (None: nothing recorded),
    ``found_args`` what it runs; ``seen`` says when it was noticed ("before the experiment", or
    the experiment's state)."""

    name: ClassVar[str] = "config_changed_outside"
    server: str
    config_id: int
    recorded_args: JSON | None
    found_args: JSON
    seen: str
    experiment_id: int | None = None


@dataclass(frozen=True, kw_only=True)
class ProposalCreated(AuditEvent):
    """The bot proposed a change; ``plan_hash`` is what an approval must match."""

    name: ClassVar[str] = "proposal_created"
    server: str
    proposal_id: int
    plan_hash: str
    change: JSON
    expires_at: datetime


@dataclass(frozen=True, kw_only=True)
class ProposalApproved(AuditEvent):
    """A person approved a proposal, for the plan with this hash."""

    name: ClassVar[str] = "proposal_approved"
    server: str
    proposal_id: int
    plan_hash: str


@dataclass(frozen=True, kw_only=True)
class ProposalRejected(AuditEvent):
    """A person rejected a proposal."""

    name: ClassVar[str] = "proposal_rejected"
    server: str
    proposal_id: int
    plan_hash: str
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class ExperimentCreated(AuditEvent):
    """An experiment row was created, in ``state``."""

    name: ClassVar[str] = "experiment_created"
    server: str
    experiment_id: int
    state: str
    change: JSON
    proposal_id: int | None = None


@dataclass(frozen=True, kw_only=True)
class ExperimentTransitioned(AuditEvent):
    """An experiment moved from one state to another."""

    name: ClassVar[str] = "experiment_transitioned"
    server: str
    experiment_id: int
    from_state: str
    to_state: str
    reason: str
    details: JSON = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class RestartStarted(AuditEvent):
    """The bot began restarting a server with these launch arguments."""

    name: ClassVar[str] = "restart_started"
    server: str
    args: JSON
    experiment_id: int | None = None


@dataclass(frozen=True, kw_only=True)
class RestartFinished(AuditEvent):
    """A restart ended; ``ok`` is whether the server came back healthy."""

    name: ClassVar[str] = "restart_finished"
    server: str
    ok: bool
    duration_s: float
    experiment_id: int | None = None
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class RevertExecuted(AuditEvent):
    """The server was put back on its last-known-good configuration."""

    name: ClassVar[str] = "revert_executed"
    server: str
    ok: bool
    config_id: int | None = None
    experiment_id: int | None = None
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class VerdictReached(AuditEvent):
    """The gate decided an experiment (keep, revert, inconclusive, ...)."""

    name: ClassVar[str] = "verdict_reached"
    server: str
    experiment_id: int
    verdict: str
    summary: str
    evidence: JSON = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class BotResumed(AuditEvent):
    """The bot started and picked up the experiments that were active when it stopped."""

    name: ClassVar[str] = "bot_resumed"
    active_experiment_ids: list[int] = field(default_factory=list)
    version: str = ""


@dataclass(frozen=True, kw_only=True)
class ExperimentResumed(AuditEvent):
    """A process picked up an unfinished experiment. ``previous`` is the process that carried
    it (None: nobody held it), ``how`` how its carrying ended, in words (its process is gone,
    killed or crashed; its lease ran out; it gave the experiment up when it stopped), and
    ``last_read_at`` when the server was last read for it (ISO, the experiment's clock)."""

    name: ClassVar[str] = "experiment_resumed"
    server: str
    experiment_id: int
    state: str
    previous: str | None
    how: str
    last_read_at: str | None = None


@dataclass(frozen=True, kw_only=True)
class MeasurementGap(AuditEvent):
    """The server went unread for ``seconds`` in the middle of a measurement (``phase``):
    kvpilot was down, or the server's metrics did not answer (``cause``). A bridged gap is
    measured around (its batches count for nothing); one that was not cut the measurement."""

    name: ClassVar[str] = "measurement_gap"
    server: str
    experiment_id: int
    phase: str
    since: str  # the last reading before the gap (ISO, the experiment's clock)
    seconds: float
    bridged: bool
    cause: str


@dataclass(frozen=True, kw_only=True)
class BotStopped(AuditEvent):
    """The bot was asked to stop (SIGTERM): where each experiment it carried was left.

    Each entry has ``id``, ``server``, ``state`` and ``stopped`` (False when its work was still
    inside a restart when the bot exited); the next start resumes them."""

    name: ClassVar[str] = "bot_stopped"
    experiments: list[JSON] = field(default_factory=list)
    signal: str = ""


@dataclass(frozen=True, kw_only=True)
class CampaignStarted(AuditEvent):
    """A campaign began on a server; ``approved_by`` approved its plan once (None: each step
    is approved on its own), and ``plan`` names exactly what that approval allows."""

    name: ClassVar[str] = "campaign_started"
    server: str
    campaign_id: int
    plan: JSON
    approved_by: str | None = None


@dataclass(frozen=True, kw_only=True)
class CampaignEnded(AuditEvent):
    """A campaign ended: why, after how many steps."""

    name: ClassVar[str] = "campaign_ended"
    server: str
    campaign_id: int
    reason: str
    steps: int


@dataclass(frozen=True, kw_only=True)
class BoundLearned(AuditEvent):
    """A step did not run (failed start, death under load): the value, and the side of it
    that is no longer proposed for this server without force."""

    name: ClassVar[str] = "bound_learned"
    server: str
    arg: str
    limit: float
    above: bool
    reason: str
    experiment_id: int | None = None


@dataclass(frozen=True, kw_only=True)
class Note(AuditEvent):
    """Free text for anything without its own kind."""

    name: ClassVar[str] = "note"
    text: str
    server: str | None = None
    experiment_id: int | None = None


@dataclass(frozen=True, kw_only=True)
class AccessDenied(AuditEvent):
    """A person asked for something they may not do, or that may not be done now.

    ``actor`` is who asked; ``action`` what they asked for (``approve``, ``propose``, ...);
    ``reason`` what the bot told them.
    """

    name: ClassVar[str] = "access_denied"
    action: str
    reason: str
    channel: str | None = None
    server: str | None = None
    proposal_id: int | None = None
    experiment_id: int | None = None


@dataclass(frozen=True, kw_only=True)
class RequestRejected(AuditEvent):
    """A request that did not prove it came from Slack (bad or missing signature, too old)."""

    name: ClassVar[str] = "request_rejected"
    status: int
    reason: str
    path: str = ""


@dataclass(frozen=True, kw_only=True)
class FreezeSet(AuditEvent):
    """Someone froze changes: no restart of the scope's servers starts until it ends."""

    name: ClassVar[str] = "freeze_set"
    freeze_id: int
    scope: str
    target: str
    reason: str
    until: str | None
    server: str | None = None


@dataclass(frozen=True, kw_only=True)
class FreezeLifted(AuditEvent):
    """Someone lifted a freeze before its end."""

    name: ClassVar[str] = "freeze_lifted"
    freeze_id: int
    scope: str
    target: str
    server: str | None = None


@dataclass(frozen=True, kw_only=True)
class AlertPosted(AuditEvent):
    """kvpilot told a channel, unasked, that something needs a look."""

    name: ClassVar[str] = "alert_posted"
    server: str
    kind: str
    channel: str
    evidence: JSON


EVENT_TYPES: dict[str, type[AuditEvent]] = {
    cls.name: cls
    for cls in (
        ServerRegistered,
        ConfigApplied,
        ConfigChangedOutside,
        ProposalCreated,
        ProposalApproved,
        ProposalRejected,
        ExperimentCreated,
        ExperimentTransitioned,
        RestartStarted,
        RestartFinished,
        RevertExecuted,
        VerdictReached,
        BotResumed,
        ExperimentResumed,
        MeasurementGap,
        BotStopped,
        Note,
        AccessDenied,
        RequestRejected,
        CampaignStarted,
        CampaignEnded,
        BoundLearned,
        FreezeSet,
        FreezeLifted,
        AlertPosted,
    )
}


def record(db: Database, event: AuditEvent) -> int:
    """Append ``event`` to the audit log; returns its row id.

    Only registered kinds are accepted, so that every name in the log has a known schema.
    """
    if EVENT_TYPES.get(event.name) is not type(event):
        raise TypeError(f"{type(event).__name__} is not a registered audit event kind")
    properties = event.properties()
    server = properties.get("server")
    experiment_id = properties.get("experiment_id")
    cursor = db.execute(
        "INSERT INTO audit_log"
        " (name, actor, created_at, server, experiment_id, properties_json)"
        " VALUES (?, ?, ?, ?, ?, ?)",
        [event.name, event.actor, utc_iso(event.created), server, experiment_id, dumps(properties)],
    )
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def events(
    db: Database,
    *,
    server: str | None = None,
    experiment_id: int | None = None,
    name: str | None = None,
) -> list[JSON]:
    """Audit rows matching every given filter, oldest first.

    Each row is ``{"id", "name", "actor", "created_at", "server", "experiment_id",
    "properties"}`` with ``properties`` parsed from JSON.
    """
    where: list[str] = []
    params: list[object] = []
    for column, value in (("server", server), ("experiment_id", experiment_id), ("name", name)):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    sql = (
        "SELECT id, name, actor, created_at, server, experiment_id, properties_json FROM audit_log"
    )
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY id"
    rows: list[JSON] = []
    for row in db.query(sql, params):
        row["properties"] = loads(row.pop("properties_json"))
        rows.append(row)
    return rows
