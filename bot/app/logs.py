"""The bot's own logs: JSON lines on stderr, with secrets removed from every record.

The long-running front end (`kvpilot serve`) calls `configure()` once, after it has read its
configuration:

    from bot.app import logs
    logs.configure("INFO", json=True, secrets=logs.config_secrets(config))

Why JSON lines: journald and `docker logs` keep one record per line, and `jq` can filter them
(`journalctl -u kvpilot -o cat | jq 'select(.level == "ERROR")'`) without a parser for a
home-made format. Each line holds `time` (UTC, ISO 8601), `level`, `logger`, `message`,
`thread`, `exc_info` (the formatted traceback) when there is one, and every `extra=` field of the
call.

Why redaction happens here and not at the call sites: a secret reaches a log through paths nobody
writes on purpose, such as an exception message that quotes a request, a library's debug line
with its headers, or an argument that happens to be a configuration object. So one filter on the
handler rewrites every record before any formatter sees it: the message with its arguments, the
traceback text, the stack, and the extra fields. It removes Slack tokens by their shape
(`xoxb-`, `xoxp-`, `xapp-`, ...), `Authorization` header values and `Bearer` credentials,
`token=`/`api_key=`-style parameters, Slack response URLs and webhooks, and, literally, the
values of `SLACK_BOT_TOKEN`, `SLACK_APP_TOKEN`, `SLACK_SIGNING_SECRET`, of any environment
variable whose name says it holds a secret (`*_API_KEY`, `*_TOKEN`, `*_SECRET`, `*_PASSWORD`),
and of the secrets passed in (the servers' configured API keys).

Libraries that install their own handlers bypass the root handler and so this filter; uvicorn
does unless it is given `log_config=None`, which makes its records propagate to the root logger.
"""

from __future__ import annotations

import functools
import json as jsonlib
import logging
import os
import re
import sys
import threading
import traceback
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from bot.app.config import Config

REDACTED = "[REDACTED]"
SLACK_SECRET_VARIABLES = ("SLACK_BOT_TOKEN", "SLACK_APP_TOKEN", "SLACK_SIGNING_SECRET")
# Environment variables whose values are treated as secrets by their name alone.
_SECRET_NAME = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD|PASSWD)$", re.IGNORECASE)
# Shorter values are not redacted literally: replacing "abc" everywhere would mangle the logs,
# and a value that short gives no protection anyway.
MIN_LITERAL_LENGTH = 6
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

_SECRET_KEY = r"(?:[a-z0-9]+_)*(?:token|api_?key|secret|password)"
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # An Authorization header's value, with or without its scheme, in a raw header, a dict or
    # tuple repr (also of bytes) or JSON.
    (
        re.compile(
            r"""(?i)(\bauthorization(?:['"]?\s*[:=]|['"]\s*,)\s*(?:b?['"])?)"""
            r"""((?:bearer|basic|token|bot)\s+)?[^\s'",;}\])]+"""
        ),
        r"\1\g<2>" + REDACTED,
    ),
    # A bearer credential anywhere else ("Bearer abc.def").
    (re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{4,}+(?!\[)"), r"\1" + REDACTED),
    # key=value (query strings, form bodies, keyword reprs) for secret-looking keys: Slack's
    # verification `token`, `api_key`, `client_secret`, `password`, `SLACK_BOT_TOKEN`, ...
    (
        re.compile(rf"(?i)(?<![A-Za-z0-9])({_SECRET_KEY}=)[^\s&,;'\"]+"),
        r"\1" + REDACTED,
    ),
    # "key": "value" (JSON, dict reprs) for the same keys.
    (
        re.compile(rf"""(?i)(['"]{_SECRET_KEY}['"]\s*:\s*)(['"])[^'"]*\2"""),
        r"\1\2" + REDACTED + r"\2",
    ),
    # Slack's response URLs and incoming webhooks: whoever holds one can post to the channel.
    (re.compile(r"(?i)(hooks\.slack\.com(?:/|%2F))[^\s&'\",;)\]]+"), r"\1" + REDACTED),
    # Slack tokens wherever else they appear, keeping their kind: bot, user, app-level, legacy
    # and refresh tokens (xoxe.xoxp-..., xoxe-...).
    (re.compile(r"\b(?:xoxe\.)?(xox[a-z]|xapp)-[A-Za-z0-9-]+"), r"\1-" + REDACTED),
    (re.compile(r"\bxoxe-[A-Za-z0-9-]+"), "xoxe-" + REDACTED),
)


def _replace(match: re.Match[str], replacement: str) -> str:
    """The replacement, unless an earlier rule already redacted this value."""
    found = match.group(0)
    return found if "REDACTED" in found else match.expand(replacement)


# The attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD_ATTRIBUTES = frozenset(
    {
        *logging.LogRecord("", 0, "", 0, "", None, None).__dict__,
        "message",
        "asctime",
        "taskName",
    }
)


class Redactor:
    """Removes secrets from text: known values literally, the rest by their shape."""

    def __init__(self, literals: Iterable[str] = ()) -> None:
        self._literals: set[str] = set()
        self._literal_pattern: re.Pattern[str] | None = None
        self.add(literals)

    def add(self, values: Iterable[str]) -> None:
        """Also remove these values (ignoring empty and very short ones)."""
        for value in values:
            secret = value.strip()
            if len(secret) >= MIN_LITERAL_LENGTH:
                self._literals.add(secret)
        if self._literals:
            # Longest first, so a secret that contains another is removed whole.
            ordered = sorted(self._literals, key=len, reverse=True)
            self._literal_pattern = re.compile("|".join(re.escape(v) for v in ordered))

    def __call__(self, text: str) -> str:
        if self._literal_pattern is not None:
            text = self._literal_pattern.sub(REDACTED, text)
        for pattern, replacement in _PATTERNS:
            text = pattern.sub(functools.partial(_replace, replacement=replacement), text)
        return text

    def value(self, value: Any) -> Any:
        """A JSON-ready copy of an extra field's value, with secrets removed from its strings."""
        if isinstance(value, str):
            return self(value)
        if value is None or isinstance(value, (bool, int, float)):
            return value
        if isinstance(value, Mapping):
            return {self(str(k)): self.value(v) for k, v in value.items()}
        if isinstance(value, (list, tuple, set, frozenset)):
            return [self.value(v) for v in value]
        return self(str(value))


def environment_secrets(env: Mapping[str, str]) -> list[str]:
    """The values of the Slack variables and of every variable named like a secret."""
    return [
        value
        for name, value in env.items()
        if value and (name in SLACK_SECRET_VARIABLES or _SECRET_NAME.search(name))
    ]


def config_secrets(config: Config) -> list[str]:
    """The servers' API keys, whether written in kvpilot.toml or read from `api_key_env`."""
    return [s.api_key for s in config.servers.values() if s.api_key]


class RedactingFilter(logging.Filter):
    """Rewrites a record in place so that no handler or formatter can see a secret.

    The message is formatted with its arguments here (so a secret passed as an argument is
    caught) and the arguments dropped; the traceback is formatted here and kept only as text.
    The filter never raises: a record it cannot format becomes a note saying so, because
    logging's own error report would print the raw arguments to stderr.
    """

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            self._rewrite(record)
        except Exception as exc:  # e.g. an argument whose repr() raises
            record.msg = (
                f"a log record could not be checked for secrets and was dropped "
                f"({type(exc).__name__}); it was logged at {record.pathname}:{record.lineno}"
            )
            record.args = None
            record.exc_info = None
            record.exc_text = None
            record.stack_info = None
            for key in list(record.__dict__):
                if key not in _STANDARD_ATTRIBUTES:
                    delattr(record, key)
        return True

    def _rewrite(self, record: logging.LogRecord) -> None:
        redact = self.redactor
        try:
            message = record.getMessage()
        except Exception as exc:  # a call whose arguments do not fit its format string
            message = (
                f"unformattable log call ({type(exc).__name__}: {exc}): {record.msg!r} "
                f"with arguments {record.args!r}"
            )
        record.msg = redact(message)
        record.args = None
        if record.exc_info and record.exc_info[0] is not None:
            text = "".join(traceback.format_exception(*record.exc_info))
            record.exc_text = redact(text.rstrip("\n"))
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        record.exc_info = None
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        for key in list(record.__dict__):
            if key not in _STANDARD_ATTRIBUTES:
                setattr(record, key, redact.value(record.__dict__[key]))


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "thread": record.threadName,
        }
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exc_info"] = record.exc_text
        if record.stack_info:
            line["stack_info"] = record.stack_info
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRIBUTES and key not in line:
                line[key] = value
        return jsonlib.dumps(line, ensure_ascii=False, default=str)


class _Handler(logging.StreamHandler[TextIO]):
    """A stream handler whose own error report cannot leak a record's content."""

    def handleError(self, record: logging.LogRecord) -> None:
        if not logging.raiseExceptions:
            return
        kind = sys.exc_info()[0]
        name = kind.__name__ if kind else "error"
        try:
            self.stream.write(f"kvpilot: a log record from {record.name} was lost ({name})\n")
        except Exception:
            return


def parse_level(level: int | str) -> int:
    """A logging level from a number or a name such as "info"; a clear error otherwise."""
    if isinstance(level, int) and not isinstance(level, bool):
        return level
    name = str(level).strip().upper()
    if name not in LEVELS:
        raise ValueError(f"log level {level!r} is not known; use one of {', '.join(LEVELS)}")
    return int(logging.getLevelName(name))


# Libraries that log a line per routine event at INFO: APScheduler three per experiment step,
# httpx and httpcore one per request (a scrape every few seconds per server).
CHATTY = ("apscheduler", "httpx", "httpcore")


def configure(
    level: int | str = "INFO",
    json: bool = True,
    *,
    secrets: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    stream: TextIO | None = None,
    catch_uncaught: bool = True,
) -> RedactingFilter:
    """Send every log record to stderr (or `stream`), secrets removed, as JSON lines or text.

    Replaces the root logger's handlers, so calling it again reconfigures rather than doubling
    the output. `env` (default: the process environment) supplies the Slack secrets and every
    variable named like a secret; `secrets` adds values known only from the configuration.
    Python warnings and uncaught exceptions (main and other threads) are logged too, so that
    their text passes the same filter instead of going to stderr raw. Returns the filter;
    `filter.redactor.add([...])` adds secrets learnt later.
    """
    numeric = parse_level(level)
    redactor = Redactor([*environment_secrets(os.environ if env is None else env), *secrets])
    redacting = RedactingFilter(redactor)
    handler = _Handler(sys.stderr if stream is None else stream)
    handler.addFilter(redacting)
    if json:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in CHATTY:  # their routine lines only at DEBUG; their warnings always
        logging.getLogger(name).setLevel(logging.WARNING if numeric > logging.DEBUG else numeric)
    # Off, then on: captureWarnings(True) does nothing while an earlier configure() still holds
    # the warnings, even if something (a test runner, a library) replaced showwarning since.
    logging.captureWarnings(False)
    logging.captureWarnings(True)
    if catch_uncaught:
        _install_uncaught_hooks()
    return redacting


def _install_uncaught_hooks() -> None:
    log = logging.getLogger("kvpilot.uncaught")

    def main_hook(
        kind: type[BaseException], value: BaseException, tb: TracebackType | None
    ) -> None:
        if issubclass(kind, KeyboardInterrupt):
            sys.__excepthook__(kind, value, tb)
            return
        log.critical("uncaught exception", exc_info=(kind, value, tb))

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit or args.exc_value is None:
            return
        name = args.thread.name if args.thread is not None else "?"
        log.error(
            "uncaught exception in thread %s",
            name,
            exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
        )

    sys.excepthook = main_hook
    threading.excepthook = thread_hook


def configured() -> bool:
    """Whether `configure()` holds the root logger (tests undo an in-process `serve`'s)."""
    return any(isinstance(h, _Handler) for h in logging.getLogger().handlers)


def as_configured() -> list[str]:
    """Arguments for a child process (the sampler's) to log as this one does: its level, and
    `--log-json` where its lines are JSON; none where `configure()` was not called."""
    root = logging.getLogger()
    handlers = [h for h in root.handlers if isinstance(h, _Handler)]
    if not handlers:
        return []
    level = ["--log-level", logging.getLevelName(root.level)]
    return level + (["--log-json"] if isinstance(handlers[0].formatter, JsonFormatter) else [])


def reset() -> None:
    """Undo `configure()`: no root handlers, default hooks (for tests and embedding)."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.setLevel(logging.WARNING)
    for name in CHATTY:
        logging.getLogger(name).setLevel(logging.NOTSET)
    logging.captureWarnings(False)
    sys.excepthook = sys.__excepthook__
    threading.excepthook = threading.__excepthook__
