"""The chat templates as an operator reads them: every line where it belongs, in both renderers."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bot.chat.messages import Message
from bot.chat.render import TEMPLATES
from bot.console.text import terminal_text
from bot.slack.blocks import blocks

# A block tag standing alone on its line (trim_blocks removes that line's newline, as meant).
ALONE = re.compile(r"\{%.*?%\}")


def _glued(path: Path) -> list[str]:
    """Lines of text that end with a block tag and run straight into the next line.

    The environment's trim_blocks removes the newline after every block tag, also after an
    `{% endif %}` closing a line of text, so such a line is glued to the next one ("...before
    23:33 UTC*Trial*: 1,058 tok/s"). The templates keep that newline with an empty line after it,
    or with Jinja's `+%}`, which turns trim_blocks off for that tag.
    """
    lines = path.read_text().split("\n")
    return [
        f"{path.relative_to(TEMPLATES)}:{i + 1}: {line.strip()[-50:]}"
        for i, line in enumerate(lines[:-1])
        if line.strip().endswith("%}")
        and not line.strip().endswith("+%}")
        and not ALONE.fullmatch(line.strip())
        and lines[i + 1].strip() != ""
    ]


def test_no_template_glues_a_line_to_the_next() -> None:
    glued = [g for path in sorted(TEMPLATES.rglob("*.j2")) for g in _glued(path)]
    assert glued == [], "a line ending in a block tag needs an empty line after it:\n" + "\n".join(
        glued
    )


VERDICT: dict[str, Any] = {
    "e": {"id": 7, "server": "incident", "state": "kept", "change": "mem_fraction_static=0.88"},
    "r": {
        "baseline": {"mean": 900.0, "ci95": [880.0, 920.0]},
        "baseline_source": "measured before 23:33 UTC",
        "trial": {"mean": 1058.0, "ci95": [1000.0, 1100.0]},
        "effect": {"mean": 0.18, "ci95": [0.10, 0.25]},
        "rule": "the decode rate rose",
        "batches": 6,
    },
    "reason": "kept: the decode rate rose",
    "then": "the change stays",
    "took_s": 1100.0,
}


@pytest.mark.parametrize(
    ("render", "lines"),
    [
        (
            terminal_text,
            [
                "Baseline: 900.0 tok/s (95% 880.0..920.0), measured before 23:33 UTC",
                "Trial: 1,058.0 tok/s (95% 1,000.0..1,100.0)",
                "Why it ended: kept: the decode rate rose; then: the change stays",
                "Took: 18.3 min, 6 batches",
            ],
        ),
        (
            lambda m: "\n".join(b["text"]["text"] for b in blocks(m) if b.get("text")),
            [
                "*Baseline*: 900.0 tok/s (95% 880.0..920.0), measured before 23:33 UTC",
                "*Trial*: 1,058.0 tok/s (95% 1,000.0..1,100.0)",
                "*Why it ended*: kept: the decode rate rose; then: the change stays",
                "*Took*: 18.3 min, 6 batches",
            ],
        ),
    ],
    ids=["terminal", "slack"],
)
def test_the_verdict_reads_line_by_line(render: Callable[[Message], str], lines: list[str]) -> None:
    text = render(Message.from_template("chat/verdict.md.j2", **VERDICT))
    shown = text.splitlines()
    for line in lines:
        assert line in shown, f"{line!r} is not a line of:\n{text}"
