"""Diagnose over a group: servers grouped (by model, say), measured together.

Every server of the group is measured at the same time (one thread each: measuring is mostly
waiting), so a group of twenty takes as long as one server. A server that cannot be measured is
reported as such; it does not stop the others. The group summary puts the servers side by side
and adds up their throughput. (How many servers of a group may restart at once is the
experiments' business: `playbooks.experiments.restart_limits`.)
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from playbooks.clock import Clock
from playbooks.diagnose.measure import MeasurementError
from playbooks.diagnose.playbook import diagnose
from playbooks.engines.base import EngineClient, EngineError
from playbooks.engines.types import VERDICT_ORDER, DiagnoseSettings
from playbooks.sources.metrics_source import describe_source
from playbooks.types import DiagnoseFinding


# ----------------------------------------------------------------------------- diagnose
@dataclass(frozen=True)
class Member:
    """One server of a group, ready to be measured."""

    name: str
    client: EngineClient
    settings: DiagnoseSettings


@dataclass
class MemberResult:
    name: str
    url: str
    metrics_from: str
    finding: DiagnoseFinding | None
    error: str | None

    def summary(self) -> dict[str, Any]:
        """One row of the group summary."""
        row: dict[str, Any] = {"server": self.name, "url": self.url, "error": self.error}
        f = self.finding
        if f is None:
            return row
        best = sorted(
            (o for o in f.options if not o.considered),  # actions off the server count too
            key=lambda o: -VERDICT_ORDER[o.verdict],
        )
        top = best[0] if best and best[0].verdict in ("recommended", "possible") else None
        row.update(
            bottleneck=f.bottleneck,
            generation_tokens_per_s=None if f.generation is None else round(f.generation.mean, 1),
            token_usage=None if f.token_usage is None else round(f.token_usage, 3),
            running=round(f.running, 1),
            queued=round(f.queued, 1),
            max_total_num_tokens=f.max_total_num_tokens,
            top_change=None if top is None else top.title,
            top_verdict=None if top is None else top.verdict,
        )
        return row


@dataclass
class GroupReport:
    group: str
    started_at: str
    finished_at: str
    members: list[MemberResult]

    @property
    def failed(self) -> list[MemberResult]:
        return [m for m in self.members if m.finding is None]

    def summary(self) -> dict[str, Any]:
        """The group at a glance: bottlenecks counted, throughput added up, what to try."""
        rows = [m.summary() for m in self.members]
        measured = [r for r in rows if r["error"] is None]
        findings = [m.finding for m in self.members if m.finding is not None]
        rates = [f.generation.mean for f in findings if f.generation is not None]
        usages = [f.token_usage for f in findings if f.token_usage is not None]
        bottlenecks: dict[str, list[str]] = {}
        for r in measured:
            bottlenecks.setdefault(r["bottleneck"], []).append(r["server"])
        return {
            "group": self.group,
            "servers": len(rows),
            "measured": len(measured),
            "failed": [r["server"] for r in rows if r["error"] is not None],
            "generation_tokens_per_s_total": round(sum(rates), 1) if rates else None,
            "token_usage_mean": round(statistics.fmean(usages), 3) if usages else None,
            "bottlenecks": bottlenecks,
            "changes_to_try": [
                {"server": r["server"], "change": r["top_change"], "verdict": r["top_verdict"]}
                for r in measured
                if r["top_change"] is not None
            ],
            "rows": rows,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "summary": self.summary(),
            "servers": {
                m.name: {
                    "url": m.url,
                    "metrics_from": m.metrics_from,
                    "error": m.error,
                    "finding": None if m.finding is None else m.finding.to_json(),
                }
                for m in self.members
            },
        }


def diagnose_group(
    group: str,
    members: list[Member],
    clock: Clock,
    *,
    on_progress: Callable[[str, float, float, str], None] | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> GroupReport:
    """Diagnose every member at once; a member that fails is reported, not raised."""
    if not members:
        raise ValueError(f"group {group!r} has no servers to diagnose")
    started = now()

    def one(member: Member) -> MemberResult:
        def progress(elapsed: float, target: float, message: str) -> None:
            if on_progress is not None:
                on_progress(member.name, elapsed, target, message)

        source = describe_source(member.client)
        try:
            finding = diagnose(member.client, clock, member.settings, progress, now)
        except (EngineError, MeasurementError, ValueError) as exc:
            return MemberResult(member.name, member.client.base_url, source, None, str(exc))
        finding.notes.append(f"metrics read from {source}")
        return MemberResult(member.name, member.client.base_url, source, finding, None)

    with ThreadPoolExecutor(max_workers=len(members), thread_name_prefix="diagnose") as pool:
        results = list(pool.map(one, members))
    return GroupReport(
        group=group,
        started_at=started.isoformat(timespec="seconds"),
        finished_at=now().isoformat(timespec="seconds"),
        members=results,
    )
