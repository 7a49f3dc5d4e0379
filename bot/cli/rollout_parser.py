"""The `kvpilot rollout` command's arguments (light: the command itself loads on use)."""

from __future__ import annotations

from typing import Any

from bot.cli.output import add_output, id_argument


def add_rollout_parser(sub: Any) -> None:
    r = sub.add_parser(
        "rollout",
        help="roll a change kept on one server out to its group's other servers, one gated "
        "experiment each",
        description="Propose the change kept by experiment ID for the other servers of its "
        "group with the same engine, model, GPU memory and KV capacity, run it on them "
        "(max_concurrent_restarts at a time), each measured by the gate, and stop and revert the "
        "servers it changed at the first one not kept. Run it again to resume a rollout it left.",
    )
    r.add_argument("--from-experiment", type=id_argument, required=True, metavar="ID",
                   help="a kept experiment on a server of a group")  # fmt: skip
    r.add_argument("--config", default=None, help="kvpilot.toml")
    r.add_argument("--yes", action="store_true", help="approve the rollout without asking")
    add_output(r, "print the rollout as JSON")
