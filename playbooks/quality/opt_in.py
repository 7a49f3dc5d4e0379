"""The verdict of a lossy change once its server guards it with an answer quality check.

An engine calls a change that trades answer quality away `needs_opt_in`. Where the operator
named its arguments in `lossy_ok` and configured a check, the check is the safeguard the opt-in
asked for: the change is proposable like any other (`possible`), and its reasons say which
check must pass before it is kept. Without a check, or for an argument not opted in, the
engine's verdict stands.
"""

from __future__ import annotations

from dataclasses import replace

from playbooks.engines.types import Option
from playbooks.quality.check import QualityCheck


def guarded(option: Option, check: QualityCheck | None) -> Option:
    """`option` as the server's quality check leaves it (see the module docstring)."""
    if option.verdict != "needs_opt_in" or check is None or not option.change:
        return option
    if not all(name in check.lossy_ok for name in option.change):
        return option
    return replace(
        option,
        verdict="possible",
        reasons=[
            *option.reasons,
            f"opted in ({', '.join(option.change)} in lossy_ok): kept only if "
            f"{check.describe()} passes after the gate's keep",
        ],
    )
