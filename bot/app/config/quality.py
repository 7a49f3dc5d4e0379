"""`[servers.NAME.quality]` and `[groups.NAME.quality]`: the answer quality check and its opt-in.

    [servers.kimi.quality]
    lossy_ok = ["kv_cache_dtype"]     # changes of these may be kept once the check passes
    prompts = "golden.jsonl"          # golden prompts, compared with greedy decoding
    max_tokens = 64
    min_exact_match = 0.9             # and/or min_token_overlap = 0.8

    [groups.kimi.quality]
    lossy_ok = ["kv_cache_dtype"]
    command = ["python", "eval.py"]   # run with KVPILOT_SERVER_URL set; exit status 0 passes
    timeout_s = 900

A server's own table wins over its group's (the whole table, not key by key). Paths are
relative to the configuration file, and the command runs in its directory. Without a table,
changes that can alter answers are proposed and approved as before, with no check.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from pathlib import Path
from typing import Any

from bot.app.config.servers import ServerConfig
from bot.app.config.values import ConfigError, check_keys, number, string
from playbooks.engines import engine_named
from playbooks.quality.check import (
    DEFAULT_ANSWER_TIMEOUT_S,
    DEFAULT_COMMAND_TIMEOUT_S,
    DEFAULT_MAX_TOKENS,
    EvalCommand,
    GoldenPrompts,
    QualityCheck,
)
from playbooks.quality.prompts import PromptFileError, read_prompts

GOLDEN_KEYS = {"prompts", "max_tokens", "min_exact_match", "min_token_overlap"}
KEYS = {"lossy_ok", "command", "timeout_s", *GOLDEN_KEYS}
EXAMPLE = (
    'e.g. prompts = "golden.jsonl" with min_exact_match = 0.9, or command = ["python", "eval.py"]'
)


def quality(table: Any, where: str, base: Path, engines: Collection[str]) -> QualityCheck:
    """One quality table, checked for every engine its servers run (`engines`)."""
    if not isinstance(table, dict):
        raise ConfigError(
            f'{where}: expected a table: lossy_ok = ["kv_cache_dtype"] and one check, {EXAMPLE}'
        )
    check_keys(table, KEYS, where)
    lossy_ok = _lossy_ok(table, where, engines)
    has_prompts, has_command = "prompts" in table, "command" in table
    if has_prompts == has_command:
        said = "both prompts and command" if has_prompts else "neither prompts nor command"
        raise ConfigError(f"{where}: {said}; give exactly one check, {EXAMPLE}")
    if has_command:
        golden_only = sorted(GOLDEN_KEYS & set(table))
        if golden_only:
            raise ConfigError(
                f"{where}: {', '.join(golden_only)} only apply with prompts, not with command"
            )
        return QualityCheck(lossy_ok, _command(table, where, base))
    return QualityCheck(lossy_ok, _golden(table, where, base))


def _lossy_ok(table: dict[str, Any], where: str, engines: Collection[str]) -> tuple[str, ...]:
    value = table.get("lossy_ok")
    if value is None:
        raise ConfigError(
            f"{where}.lossy_ok: missing; name the arguments whose changes may be kept once the "
            'check passes, e.g. lossy_ok = ["kv_cache_dtype"]'
        )
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ConfigError(
            f"{where}.lossy_ok: expected a non-empty list of argument names, e.g. "
            f'["kv_cache_dtype"], got {value!r}'
        )
    for name in sorted(engines):
        allowed = engine_named(name).allowed_args()
        for arg in value:
            if arg not in allowed:
                raise ConfigError(
                    f"{where}.lossy_ok: {arg!r} is not an argument kvpilot changes on "
                    f"{engine_named(name).label}; use one of {', '.join(sorted(allowed))}"
                )
    return tuple(dict.fromkeys(value))


def _share(table: dict[str, Any], key: str, where: str) -> float | None:
    value = number(table, key, where, None)
    if value is not None and value > 1:
        raise ConfigError(
            f"{where}.{key}: a share between 0 and 1 (0.9 for 90%), got {table[key]!r}"
        )
    return value


def _golden(table: dict[str, Any], where: str, base: Path) -> GoldenPrompts:
    source = string(table, "prompts", where)
    assert source is not None
    try:
        prompts = read_prompts(base / source)
    except PromptFileError as exc:
        raise ConfigError(f"{where}.prompts: {exc}") from None
    max_tokens = table.get("max_tokens", DEFAULT_MAX_TOKENS)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ConfigError(
            f"{where}.max_tokens: expected a whole number of at least 1 (the longest answer "
            f"compared, in tokens), got {max_tokens!r}"
        )
    exact = _share(table, "min_exact_match", where)
    overlap = _share(table, "min_token_overlap", where)
    if exact is None and overlap is None:
        raise ConfigError(
            f"{where}: golden prompts need a tolerance: min_exact_match (the share of answers "
            "that must stay identical, e.g. 0.9) and/or min_token_overlap (the mean share of "
            "words they must keep, e.g. 0.8)"
        )
    timeout = number(table, "timeout_s", where, DEFAULT_ANSWER_TIMEOUT_S)
    assert timeout is not None
    return GoldenPrompts(prompts, source, max_tokens, exact, overlap, timeout)


def _command(table: dict[str, Any], where: str, base: Path) -> EvalCommand:
    command = table["command"]
    if isinstance(command, str):
        raise ConfigError(
            f'{where}.command: expected an argument list such as ["python", "eval.py"]; a shell '
            "string is not run (split it into its arguments)"
        )
    if (
        not isinstance(command, list)
        or not command
        or not all(isinstance(c, str) and c for c in command)
    ):
        raise ConfigError(
            f'{where}.command: expected a non-empty list of strings, e.g. ["python", "eval.py"], '
            f"got {command!r}"
        )
    timeout = number(table, "timeout_s", where, DEFAULT_COMMAND_TIMEOUT_S)
    assert timeout is not None
    return EvalCommand(tuple(command), str(base.resolve()), timeout)


def with_quality(
    servers: dict[str, ServerConfig], servers_table: dict[str, Any], groups_table: Any, base: Path
) -> dict[str, ServerConfig]:
    """Every server with its quality check: its own table, else its group's, else none."""
    by_group: dict[str, QualityCheck] = {}
    for name, body in (groups_table if isinstance(groups_table, dict) else {}).items():
        if isinstance(body, dict) and "quality" in body:
            engines = {s.engine for s in servers.values() if s.group == name}
            by_group[name] = quality(body["quality"], f"groups.{name}.quality", base, engines)
    out = {}
    for name, server in servers.items():
        own = servers_table[name].get("quality")
        if own is not None:
            check: QualityCheck | None = quality(
                own, f"servers.{name}.quality", base, {server.engine}
            )
        else:
            check = by_group.get(server.group) if server.group is not None else None
        out[name] = replace(server, quality=check)
    return out
