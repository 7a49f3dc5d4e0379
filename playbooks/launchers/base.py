"""The launcher interface and the server-argument editing it relies on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from playbooks.server_args import ALLOWED, ArgError, check_page_divides_chunk, normalise_key


class LaunchError(Exception):
    """Starting or stopping failed; `reason` is what an operator needs to read."""

    def __init__(self, reason: str, log_tail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.log_tail = log_tail


@dataclass(frozen=True)
class ServerState:
    running: bool
    ready: bool
    pid: int | None
    exit_code: int | None
    reason: str  # why it is down, from the exit status and SGLang's log lines ("" when fine)


class Launcher(Protocol):
    kind: str

    def current_args(self) -> list[str]:
        """The SGLang server arguments of the running (or last started) server."""
        ...

    def apply(self, args: list[str]) -> None:
        """Stop the server, start it with `args`, wait until it is ready (raises LaunchError)."""
        ...

    def state(self) -> ServerState: ...

    def stop(self) -> None: ...


def with_change(args: list[str], change: dict[str, Any]) -> list[str]:
    """Apply allowed changes to an SGLang argument list (never a shell string).

    Existing `--flag value` / `--flag=value` / bare `--flag` entries for a changed key are removed,
    then the new value is appended, checked and spelt as SGLang's argparse type reads it (an int
    flag never gets `40.0`, which SGLang refuses); `False` removes a boolean flag, `None` any flag.
    """
    out = list(args)
    for key, value in change.items():
        name = normalise_key(key)
        spec = ALLOWED.get(name)
        if spec is None:
            raise ArgError(f"{name!r} is not a server argument kvpilot may change")
        out = _without(out, spec.flag)
        if value is not None:
            out += spec.cli(value)
    if {"page_size", "chunked_prefill_size"} & {normalise_key(k) for k in change}:
        check_page_divides_chunk(
            _int_or_none(arg_value(out, "page_size")),
            _int_or_none(arg_value(out, "chunked_prefill_size")),
        )
    return out


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _without(args: list[str], flag: str) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(args):
        tok = args[i]
        if tok == flag:
            # skip the flag and its value, if the next token is one
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                i += 1
        elif not tok.startswith(flag + "="):
            out.append(tok)
        i += 1
    return out


def arg_value(args: list[str], name: str) -> str | None:
    """The value of `--name` in an argument list (True for a bare flag as "true")."""
    flag = "--" + normalise_key(name).replace("_", "-")
    for i, tok in enumerate(args):
        if tok == flag:
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                return args[i + 1]
            return "true"
        if tok.startswith(flag + "="):
            return tok.split("=", 1)[1]
    return None
