"""The bot's structured logs: one JSON object per line, and no secret in any part of a record."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from bot.app import logs
from tests.deploy.units import REPO

BOT_TOKEN = "xoxb-1234567890-0987654321-AbCdEfGhIjKlMnOpQrStUvWx"
APP_TOKEN = "xapp-1-A012BCDEF34-5678901234567-0123456789abcdef0123456789abcdef"
SIGNING_SECRET = "8f14e45fceea167a5a36dedd4bea2543"
SGLANG_KEY = "sk-sglang-3c59dc048e8850243be8079a5c74d079"
ENV = {
    "SLACK_BOT_TOKEN": BOT_TOKEN,
    "SLACK_APP_TOKEN": APP_TOKEN,
    "SLACK_SIGNING_SECRET": SIGNING_SECRET,
    "PATH": "/usr/bin:/bin",
}
SECRETS = (BOT_TOKEN, APP_TOKEN, SIGNING_SECRET, SGLANG_KEY)


@pytest.fixture
def out() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    logs.configure("DEBUG", json=True, secrets=[SGLANG_KEY], env=ENV, stream=stream)
    try:
        yield stream
    finally:
        logs.reset()


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    text = stream.getvalue()
    for secret in SECRETS:
        assert secret not in text
    records = [json.loads(line) for line in text.splitlines()]
    assert all(isinstance(r, dict) for r in records)
    return records


def test_a_record_is_one_json_line_with_its_fields(out: io.StringIO) -> None:
    logging.getLogger("bot.reports.sampler").info(
        "sampled %d servers", 3, extra={"server": "incident", "took_s": 0.25}
    )
    (record,) = lines(out)
    assert record["message"] == "sampled 3 servers"
    assert record["level"] == "INFO" and record["logger"] == "bot.reports.sampler"
    assert record["server"] == "incident" and record["took_s"] == 0.25
    assert record["time"].endswith("+00:00") and "T" in record["time"]
    assert record["thread"] == threading.current_thread().name
    assert "exc_info" not in record


def test_tokens_in_the_message_and_in_its_arguments_are_removed(out: io.StringIO) -> None:
    log = logging.getLogger("t")
    log.info(f"connecting with {BOT_TOKEN}")
    log.info("app token %s, secret %s", APP_TOKEN, SIGNING_SECRET)
    log.info("server key %r", {"api_key": SGLANG_KEY})
    # Tokens kvpilot was not told about are still caught by their shape.
    log.warning("a user token xoxp-11-22-33-abcdef and a refresh token xoxe-1-abcdef123")
    records = lines(out)
    assert records[0]["message"] == "connecting with [REDACTED]"
    assert records[1]["message"] == "app token [REDACTED], secret [REDACTED]"
    assert "xoxp-[REDACTED]" in records[3]["message"] and "abcdef123" not in out.getvalue()
    assert "11-22-33" not in out.getvalue()


def test_authorization_headers_are_removed_in_every_spelling(out: io.StringIO) -> None:
    log = logging.getLogger("t")
    log.debug("GET /metrics Authorization: Bearer opaque-token-value-123")
    log.debug("headers %s", {"Authorization": "Bearer another-opaque-value"})
    log.debug("raw %r", [(b"authorization", b"Basic dXNlcjpwYXNzd29yZA==")])
    log.debug("body token=verification-token-xyz&user_id=U1")
    log.debug("json %s", json.dumps({"token": "json-token-value", "text": "hi"}))
    log.debug(
        "slack body %s",
        "command=%2Fkvpilot&response_url=https%3A%2F%2Fhooks.slack.com%2F"
        "commands%2FT1%2F42%2Fresponse-url-secret&text=help",
    )
    text = out.getvalue()
    for leaked in (
        "response-url-secret",
        "opaque-token-value-123",
        "another-opaque-value",
        "dXNlcjpwYXNzd29yZA",
        "verification-token-xyz",
        "json-token-value",
    ):
        assert leaked not in text, leaked
    messages = [r["message"] for r in lines(out)]
    assert messages[0] == "GET /metrics Authorization: Bearer [REDACTED]"
    assert "user_id=U1" in messages[3] and '"text": "hi"' in messages[4]
    assert messages[5].endswith("hooks.slack.com%2F[REDACTED]&text=help")


def test_exceptions_are_redacted_including_their_cause(out: io.StringIO) -> None:
    log = logging.getLogger("bot.slack.app")
    try:
        try:
            raise ConnectionError(f"POST https://slack.com/api/auth.test token={BOT_TOKEN}")
        except ConnectionError as exc:
            raise RuntimeError(f"sglang refused key {SGLANG_KEY}") from exc
    except RuntimeError:
        log.exception("posting failed for %s", APP_TOKEN)
    (record,) = lines(out)
    assert record["level"] == "ERROR" and record["message"] == "posting failed for [REDACTED]"
    assert "Traceback (most recent call last)" in record["exc_info"]
    assert "ConnectionError" in record["exc_info"] and "RuntimeError" in record["exc_info"]
    assert "[REDACTED]" in record["exc_info"]


def test_extra_fields_and_stack_traces_are_redacted(out: io.StringIO) -> None:
    logging.getLogger("t").info(
        "request",
        extra={"headers": {"authorization": f"Bearer {SGLANG_KEY}"}, "tokens": [BOT_TOKEN]},
        stack_info=True,
    )
    (record,) = lines(out)
    assert record["headers"] == {"authorization": "Bearer [REDACTED]"}
    assert record["tokens"] == ["[REDACTED]"]
    assert "stack_info" in record


def test_text_format_is_redacted_too() -> None:
    stream = io.StringIO()
    logs.configure("INFO", json=False, env=ENV, stream=stream)
    try:
        logging.getLogger("t").info("token %s", BOT_TOKEN)
        try:
            raise ValueError(APP_TOKEN)
        except ValueError:
            logging.getLogger("t").exception("failed")
    finally:
        logs.reset()
    text = stream.getvalue()
    assert BOT_TOKEN not in text and APP_TOKEN not in text
    assert "INFO t token [REDACTED]" in text and "ValueError: [REDACTED]" in text


def test_a_broken_log_call_loses_nothing_and_leaks_nothing(out: io.StringIO) -> None:
    logging.getLogger("t").error("two values %s %s", BOT_TOKEN)  # noqa: PLE1206 - on purpose
    (record,) = lines(out)
    assert record["message"].startswith("unformattable log call (TypeError")
    assert "[REDACTED]" in record["message"]


def test_uncaught_exceptions_and_warnings_pass_the_same_filter(out: io.StringIO) -> None:
    def crash() -> None:
        raise RuntimeError(f"worker died holding {BOT_TOKEN}")

    worker = threading.Thread(target=crash, name="kvpilot-worker")
    worker.start()
    worker.join()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn(f"deprecated call with {APP_TOKEN}", DeprecationWarning, stacklevel=1)
    crash_record, warning_record = lines(out)
    assert (
        crash_record["logger"] == "kvpilot.uncaught" and crash_record["thread"] == "kvpilot-worker"
    )
    assert "RuntimeError: worker died holding [REDACTED]" in crash_record["exc_info"]
    assert warning_record["logger"] == "py.warnings"


def test_reconfiguring_replaces_the_handler_and_secrets_can_be_added_later() -> None:
    first, second = io.StringIO(), io.StringIO()
    logs.configure("INFO", env={}, stream=first)
    late = logs.configure("INFO", env={}, stream=second)
    try:
        late.redactor.add(["learnt-later-secret"])
        logging.getLogger("t").info("value learnt-later-secret")
        logging.getLogger("t").debug("below the level")
    finally:
        logs.reset()
    assert first.getvalue() == ""
    (record,) = [json.loads(line) for line in second.getvalue().splitlines()]
    assert record["message"] == "value [REDACTED]"


def test_reconfiguring_takes_the_warnings_back_from_whoever_took_them_since() -> None:
    """A configure() left in place (an in-process `serve`), then warnings.showwarning replaced
    (pytest does, for each test): the next configure() still routes warnings into the log."""
    first, second = io.StringIO(), io.StringIO()
    logs.configure("INFO", env={}, stream=first)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = lambda *args, **kwargs: None
            logs.configure("INFO", env={}, stream=second)
            warnings.warn("a late warning", UserWarning, stacklevel=1)
    finally:
        logs.reset()
    (record,) = lines(second)
    assert record["logger"] == "py.warnings" and "a late warning" in record["message"]


def test_environment_variables_named_like_secrets_are_redacted() -> None:
    env = {"SGLANG_API_KEY": SGLANG_KEY, "DB_PASSWORD": "hunter2-but-longer", "HOME": "/root"}
    assert sorted(logs.environment_secrets(env)) == sorted([SGLANG_KEY, "hunter2-but-longer"])
    redact = logs.Redactor(logs.environment_secrets(env))
    assert redact(f"key {SGLANG_KEY} home /root") == "key [REDACTED] home /root"
    # Values too short to be secrets are not replaced everywhere.
    assert logs.Redactor(["abc"])("abc abc") == "abc abc"


def test_an_unknown_level_is_a_clear_error() -> None:
    assert logs.parse_level("warning") == logging.WARNING
    with pytest.raises(ValueError, match="log level 'LOUD' is not known; use one of DEBUG"):
        logs.parse_level("LOUD")


def test_a_real_process_logs_json_to_stderr_without_its_environment_secrets() -> None:
    code = (
        "import logging, os\n"
        "from bot.app import logs\n"
        "logs.configure('INFO', json=True)\n"
        "log = logging.getLogger('kvpilot')\n"
        "log.info('token is %s', os.environ['SLACK_BOT_TOKEN'])\n"
        "raise SystemExit(log.error('signing secret ' + os.environ['SLACK_SIGNING_SECRET']))\n"
    )
    env = {**os.environ, **ENV, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0 and done.stdout == ""
    records = [json.loads(line) for line in done.stderr.splitlines()]
    assert [r["message"] for r in records] == ["token is [REDACTED]", "signing secret [REDACTED]"]
    assert BOT_TOKEN not in done.stderr and SIGNING_SECRET not in done.stderr


def test_a_record_that_cannot_be_checked_is_replaced_not_leaked(out: io.StringIO) -> None:
    class Hostile:
        def __str__(self) -> str:
            raise RuntimeError(BOT_TOKEN)

        def __repr__(self) -> str:
            raise RuntimeError(BOT_TOKEN)

    logging.getLogger("t").info("value %s", Hostile(), extra={"token_holder": BOT_TOKEN})
    (record,) = lines(out)
    assert record["message"].startswith("a log record could not be checked for secrets")
    assert "test_logs.py" in record["message"] and "token_holder" not in record


def test_libraries_say_only_what_matters_at_info() -> None:
    """At INFO a scheduler line for every experiment step and an HTTP line for every scrape would
    bury kvpilot's own lines (and fill a pipe nobody drains); they come back at DEBUG."""
    stream = io.StringIO()
    try:
        logs.configure("INFO", json=True, env=ENV, stream=stream)
        logging.getLogger("apscheduler.executors.default").info('Running job "tick"')
        logging.getLogger("httpx").info("HTTP Request: GET http://127.0.0.1/metrics")
        logging.getLogger("apscheduler.scheduler").warning("job missed")
        logging.getLogger("playbooks.experiments").info("baseline -> restarting")
        assert [r["message"] for r in lines(stream)] == ["job missed", "baseline -> restarting"]
        stream.seek(0)
        stream.truncate()
        logs.configure("DEBUG", json=True, env=ENV, stream=stream)
        logging.getLogger("httpx").info("HTTP Request: GET http://127.0.0.1/metrics")
        assert [r["message"] for r in lines(stream)] == [
            "HTTP Request: GET http://127.0.0.1/metrics"
        ]
    finally:
        logs.reset()
