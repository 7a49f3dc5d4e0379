"""Put command lines through real SGLang's argument handling, without starting a server.

Runs under ``$KVPILOT_SGLANG_VENV/bin/python`` with the shim environment of ``launch.py``::

    python check_args.py IN.json OUT.json

``IN.json`` is ``{"flags": [dest, ...], "warmup": [arg, ...], "cases": [[arg, ...], ...]}``.
Each case goes through what ``python -m sglang.launch_server`` does before it starts any
process: the parser of ``ServerArgs.add_cli_args`` (argparse exits 2 on a bad value),
``ServerArgs.from_cli_args``, then ``resolve_once()`` (0.5.23's ``__post_init__`` is empty; the
checks and defaults run here, as ``launch_server.run_server`` calls it) and
``check_server_args()`` (called by the engine before the scheduler starts).

``OUT.json`` gets the parser's declaration of each flag in ``flags`` and, per case,
``{"accepted": true, "parsed": {...}, "resolved": {...}}`` or
``{"accepted": false, "stage": ..., "error": ...}``.

Importing SGLang and its first resolution take seconds, so they happen once, on the ``warmup``
command line (the one every case edits); each case then runs in a forked child, so none sees
what another's resolution left in globals or the environment.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from typing import Any

from sglang.srt.server_args import ServerArgs  # type: ignore[import-not-found]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sglang serve")  # as prepare_server_args builds it
    ServerArgs.add_cli_args(parser)
    return parser


def declarations(parser: argparse.ArgumentParser, flags: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for action in parser._actions:
        if action.dest in flags:
            out[action.dest] = {
                "option_strings": list(action.option_strings),
                "type_name": getattr(action.type, "__name__", None),
                "choices": None if action.choices is None else list(action.choices),
                "default": action.default,
                "action": type(action).__name__,
            }
    return out


def check(parser: argparse.ArgumentParser, argv: list[str], flags: list[str]) -> dict[str, Any]:
    stage = "parse"
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):  # argparse prints usage and the error, exits 2
            ns = parser.parse_args(argv)
        parsed = {flag: getattr(ns, flag) for flag in flags}
        stage = "construct"
        server_args = ServerArgs.from_cli_args(ns)
        stage = "resolve"
        server_args.resolve_once()
        stage = "check"
        server_args.check_server_args()
        stage = "report"
        resolved = server_args.resolved_dict()
    except SystemExit as exc:
        lines = err.getvalue().strip().splitlines()
        return {"accepted": False, "stage": stage, "error": lines[-1] if lines else str(exc)}
    except Exception as exc:
        return {"accepted": False, "stage": stage, "error": f"{type(exc).__name__}: {exc}"}
    return {
        "accepted": True,
        "parsed": parsed,
        "resolved": {flag: resolved.get(flag) for flag in flags},
    }


def in_child(parser: argparse.ArgumentParser, argv: list[str], flags: list[str]) -> dict[str, Any]:
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        try:
            result = check(parser, argv, flags)
        except BaseException as exc:
            result = {"accepted": False, "stage": "crash", "error": repr(exc)}
        with os.fdopen(write_fd, "w") as out:
            json.dump(result, out, default=repr)
        os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        text = pipe.read()
    _, status = os.waitpid(pid, 0)
    if not text:
        return {"accepted": False, "stage": "crash", "error": f"child wait status {status}"}
    parsed: dict[str, Any] = json.loads(text)
    return parsed


def main(in_path: str, out_path: str) -> int:
    with open(in_path) as f:
        job = json.load(f)
    flags = list(job["flags"])
    parser = build_parser()
    # The first resolution imports most of SGLang (seconds); do it once here, on the command
    # line every case starts from, so that each child starts with the modules loaded.
    check(parser, list(job["warmup"]), flags)
    results = [in_child(parser, list(argv), flags) for argv in job["cases"]]
    with open(out_path, "w") as f:
        json.dump({"declared": declarations(parser, flags), "results": results}, f, default=repr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1], sys.argv[2]))
