"""The bot watches itself: /healthz fails with the reason when Slack, the database or the
sampler fails (a served LLM server being down is not one), and /metrics says what it does."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bot.reports.sampler import Sampler
from tests.bot.harness import running_bot, twin_config
from tests.ports import free_port
from tests.slackfake import FakeSlack

SLACK = '[slack]\napprovers = ["U2"]\noperators = ["U1"]\n'


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_healthz_and_metrics_say_what_fails(tmp_path: Path, slack: FakeSlack) -> None:
    # no twin listens on the configured port: the server is down, which the bot reports
    config = twin_config(tmp_path, free_port(), slack=SLACK)
    with running_bot(config, slack) as (bot, driver):
        base = driver.url.removesuffix("/slack/events")
        sampler = bot.runtime.sampler
        assert isinstance(sampler, Sampler)  # one server: in the bot's thread
        sampler.sample_once()
        bot.slack.check()
        ok = httpx.get(f"{base}/healthz", timeout=10)
        assert ok.status_code == 200, ok.text
        body = ok.json()
        assert body["mode"] == "http" and body["ok"] is True
        assert "not reachable: incident" in body["parts"]["sampler"]["detail"]

        text = httpx.get(f"{base}/metrics", timeout=10)
        assert text.headers["content-type"].startswith("text/plain")
        m = samples(text.text)
        assert m[("kvpilot_slack_connected", ())] == 1.0
        assert m[("kvpilot_sampler_failures_total", (("server", "incident"),))] >= 1
        assert ("kvpilot_scheduler_jobs", ()) in m

        # Slack refuses the token: 503 with Slack's reason, and the refusal is counted
        slack.fail_next("auth.test", error="token_revoked")
        bot.slack.check()
        failed = httpx.get(f"{base}/healthz", timeout=10)
        assert failed.status_code == 503
        assert "slack: Slack refused auth.test: token_revoked" in failed.json()["reason"]
        m = samples(httpx.get(f"{base}/metrics", timeout=10).text)
        assert m[("kvpilot_slack_connected", ())] == 0.0
        key = (("error", "token_revoked"), ("method", "auth.test"))
        assert m[("kvpilot_slack_api_errors_total", key)] == 1.0
        bot.slack.check()  # Slack answers again
        assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200

        # another process holds the database's write lock: the bot could not record anything
        holder = sqlite3.connect(bot.config.database)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            locked = httpx.get(f"{base}/healthz", timeout=10)
        finally:
            holder.rollback()
            holder.close()
        assert locked.status_code == 503
        assert "database:" in locked.json()["reason"] and "locked" in locked.json()["reason"]

        # the sampler's thread stops: nothing would be sampled or reported
        bot.runtime.sampler.stop()
        stopped = httpx.get(f"{base}/healthz", timeout=10)
        assert stopped.status_code == 503
        assert "sampler: the sampler's thread is not running" in stopped.json()["reason"]
