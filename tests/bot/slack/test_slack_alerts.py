"""Proactive alerts against the local Slack and a KV-bound twin: one alert, not one per sample,
with its evidence and a Diagnose button that diagnoses the server in the alert's thread."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from storage import audit
from storage.db import open_db
from tests.bot.harness import CHANNEL, buttons, posted, running_bot, started, twin_config
from tests.bot.harness import wait_until as until
from tests.ports import free_port
from tests.slackfake import FakeSlack

pytestmark = pytest.mark.slow

SETTINGS = """[access]
approvers = ["U2"]
operators = ["U1"]
[sampler]
interval_s = 10
[alerts]
channel = "C0OPS"
raise_after = "3m"
"""


def alerts(slack: FakeSlack) -> list[str]:
    return [m["text"] for m in slack.messages(CHANNEL).values() if ":rotating_light:" in m["text"]]


def test_a_kv_bound_twin_is_alerted_once_and_the_button_diagnoses(
    tmp_path: Path, slack: FakeSlack
) -> None:
    # the incident's twin at 200x: 150 clients on a pool that holds about 50 of them
    config = twin_config(tmp_path, free_port(), slack=SETTINGS)
    with started(config, "incident"), running_bot(config, slack, tick_s=0.05) as (bot, driver):
        (text,) = until(lambda: alerts(slack), 60, "the alert")
        assert "`incident` turned KV-cache bound" in text
        twin_s = bot.runtime.clock.utcnow().timestamp()
        # another ten minutes of the twin's time, sampled every 10 s, judged every minute
        until(lambda: bot.runtime.clock.utcnow().timestamp() - twin_s > 600, 30, "ten twin minutes")
        time.sleep(0.2)
        assert len(alerts(slack)) == 1
        assert bot.flow.alerts.sent.items() == [(("incident", "kv_bound"), 1)]
        ts, message = until(lambda: posted(slack, "turned KV-cache bound"), 5, "the message")
        driver.click("kvpilot.diagnose", buttons(message)["kvpilot.diagnose"], user="U1",
                     message_ts=ts)  # fmt: skip
        until(
            lambda: any(
                m.get("thread_ts") == ts and "Diagnosis of incident" in m["text"]
                for m in slack.messages(CHANNEL).values()
            ),
            90,
            "the diagnosis in the alert's thread",
        )
    db = open_db(config.parent / "var" / "kvpilot.db")
    (event,) = audit.events(db, name="alert_posted")
    assert event["properties"]["kind"] == "kv_bound" and event["properties"]["evidence"]["lines"]
    assert slack.violations == []
