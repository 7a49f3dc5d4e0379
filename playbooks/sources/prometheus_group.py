"""Many servers' engine metrics from one Prometheus with one instant query (the sampler's round).

`PrometheusMetrics.reading()` asks two queries per server; the sampler reads every server every
15 s, so a fleet of 500 read through one Prometheus cost a thousand queries a round. Servers
whose metrics come from the same Prometheus, for the same engine, are read together here: one
query whose selector matches all of them, split back per server by its labels, each server's
share read exactly as its own queries' answer is (`PrometheusMetrics.reading_from`: the same
label handling, the same `max_age_s`, the same errors).

A server is read with others when its selector is label="value" matchers only (the default,
`{instance="HOST:PORT"}`, is): the batch asks for each label the servers name with a regex
alternation of their values (`{instance=~"a:1|b:2|..."}`) and gives each server the series
carrying every one of its values, which is what its own selector matches. A selector with
`!=`, `=~` or `!~` would need PromQL's regex semantics re-implemented to split the answer; such
a server keeps its own queries. The heartbeat's timestamps ride in the same query, marked with a
label of their own:

    {__name__=~"PREFIX.+", __name__!~"PREFIX.+_bucket", BATCH}
      or {__name__=~"HISTOGRAMS", BATCH}
      or label_replace(timestamp(HEARTBEAT{BATCH}), "kvpilot_scraped_at", "heartbeat", "", "")

A server whose series are missing from the answer (its last scrape failed) falls back on its own
queries for the last good scrape, as its own reading would: what it costs is paid by the servers
in trouble only. A batch holds at most `MAX_MEMBERS` servers; its query goes as POST form data
when long (`PrometheusAPI.query`). If the query itself fails, each server gets the error its own
query would have had, naming its own expression.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from playbooks.engines.base import MetricsSpec
from playbooks.sources.prometheus import PrometheusMetrics, Reading
from playbooks.sources.prometheus_api import PrometheusError, Series, label_matchers

MAX_MEMBERS = 250  # servers a query: its answer is a few hundred series per server
MARK = "kvpilot_scraped_at"  # the label that tells the heartbeat's timestamps from the series
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\'": "'", "\\n": "\n", "\\t": "\t"}
_REGEX_SPECIAL = re.compile(r"([\\.+*?()|\[\]{}^$])")


@dataclass(frozen=True)
class Member:
    name: str
    source: PrometheusMetrics
    labels: Mapping[str, str]  # its selector's label="value" pairs


def _unquoted(text: str) -> str | None:
    """A PromQL string literal's value; None for an escape this does not read (the server then
    keeps its own queries rather than risk matching the wrong series)."""
    body = text[1:-1]
    if text[0] == "`" or "\\" not in body:
        return body
    parts = re.split(r"(\\.)", body)
    if any(p.startswith("\\") and p not in _ESCAPES for p in parts):
        return None
    return "".join(_ESCAPES.get(p, p) for p in parts)


def equality_labels(matchers: str) -> dict[str, str] | None:
    """The label="value" pairs of a selector's matchers; None if it has any other matcher."""
    out: dict[str, str] = {}
    for label, op, quoted in label_matchers(matchers):
        value = _unquoted(quoted)
        if op != "=" or value is None or label == MARK or label in out:
            return None
        out[label] = value
    return out


def batches(
    sources: Mapping[str, PrometheusMetrics], cap: int = MAX_MEMBERS
) -> tuple[list[list[Member]], list[str]]:
    """The servers read together, at most `cap` a batch, each batch one Prometheus, one engine
    and one set of label names; and the servers that keep their own queries."""
    together: dict[tuple[str, MetricsSpec, tuple[str, ...]], list[Member]] = {}
    alone = []
    for name, source in sources.items():
        labels = equality_labels(source.matchers)
        if labels is None:
            alone.append(name)
            continue
        key = (source.api.base_url, source.spec, tuple(sorted(labels)))
        together.setdefault(key, []).append(Member(name, source, labels))
    out = [ms[i : i + cap] for ms in together.values() for i in range(0, len(ms), cap)]
    return out, alone


def _promql_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def batch_matchers(members: Sequence[Mapping[str, str]]) -> str:
    """Label matchers that every member's series match: for each label all of them name, a
    regex alternation of their values (Prometheus anchors it at both ends)."""
    common = set.intersection(*(set(m) for m in members)) if members else set()
    out = []
    for label in sorted(common):
        values = sorted({m[label] for m in members})
        regex = "|".join(_REGEX_SPECIAL.sub(r"\\\1", v) for v in values)
        out.append(f"{label}=~{_promql_string(regex)}")
    return ", ".join(out)


def batch_expression(source: PrometheusMetrics, matchers: str) -> str:
    """The one query for a batch (of `source`'s engine): its series and its heartbeat's
    timestamps."""
    heartbeat = f"timestamp({source.spec.heartbeat}{{{matchers}}})"
    marked = f'label_replace({heartbeat}, "{MARK}", "heartbeat", "", "")'
    return f"{source.expression_for(matchers)} or {marked}"


def split(
    answer: Sequence[Series], members: Sequence[Mapping[str, str]]
) -> list[tuple[list[Series], list[Series]]]:
    """Each member's share of a batch's answer: its engine series, and its heartbeat's
    timestamps (marked `MARK`, the mark taken off). A series is a member's when it carries each
    of the member's label values (a label it lacks reads as "", as in PromQL)."""
    shares: list[tuple[list[Series], list[Series]]] = [([], []) for _ in members]
    index: dict[tuple[str, ...], dict[tuple[str, ...], list[int]]] = {}
    for i, member in enumerate(members):
        names = tuple(sorted(member))
        key = tuple(member[n] for n in names)
        index.setdefault(names, {}).setdefault(key, []).append(i)
    for item in answer:
        heartbeat = "__name__" not in item.labels and item.labels.get(MARK) == "heartbeat"
        s = (
            Series({k: v for k, v in item.labels.items() if k != MARK}, item.t, item.value)
            if heartbeat
            else item
        )
        for names, by_values in index.items():
            for i in by_values.get(tuple(s.labels.get(n, "") for n in names), ()):
                shares[i][1 if heartbeat else 0].append(s)
    return shares


def _as_own(exc: PrometheusError, expr: str, own: str) -> PrometheusError:
    """The batch query's error as a member's own query would have had it."""
    error = type(exc)(exc.message.replace(expr, own), exc.hint, query=own)
    error.__cause__ = exc.__cause__
    return error


def read_batch(batch: Sequence[Member]) -> dict[str, Reading | Exception]:
    """Every member's reading (or what went wrong with it) from one query, in batch order."""
    first = batch[0].source
    expr = batch_expression(first, batch_matchers([m.labels for m in batch]))
    try:
        answer = first.api.query(expr)
    except PrometheusError as exc:
        return {m.name: _as_own(exc, expr, m.source.expression) for m in batch}
    out: dict[str, Reading | Exception] = {}
    for member, (series, scraped_at) in zip(
        batch, split(answer, [m.labels for m in batch]), strict=True
    ):
        try:
            out[member.name] = member.source.reading_from(series, scraped_at)
        except Exception as exc:  # a failed scrape of this server only; the caller judges it
            out[member.name] = exc
    return out
