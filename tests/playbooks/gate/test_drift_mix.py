"""The request-mix check against what requests running at a window's edges do to the ratio.

Tokens per completed request is the tokens counted in a window over the requests completed in
it; with about as many requests running as completing (long answers, a window just after a
restart), the ratio moves with the edges, not the clients. bench/tune.py found the same
incident clients read as 2,928 then 3,684 output tokens per request, and a kept gain reverted.
"""

from __future__ import annotations

import pytest

from playbooks.gate.checks import drift
from playbooks.gate.settings import GateSettings
from playbooks.gate.windows import WindowFacts

S = GateSettings()


def facts(*, output: float, completed: float, running: float, prompt: float = 400.0) -> WindowFacts:
    return WindowFacts(
        in_flight=150.0,
        queue_fraction=1.0,
        prompt_per_request=prompt,
        output_per_request=output,
        completed=completed,
        effective_rate=None,
        errors_per_request=None,
        retractions_per_min=None,
        ttft_p95_s=None,
        running=running,
    )


@pytest.mark.parametrize(
    ("name", "base", "trial", "drifted"),
    [
        (
            "long answers, as many completed as running: the edges explain +26%",
            facts(output=2928, completed=70, running=55),
            facts(output=3684, completed=75, running=55),
            False,
        ),
        (
            "short answers, thousands completed: -40% is the clients",
            facts(output=500, completed=2000, running=50),
            facts(output=300, completed=3000, running=50),
            True,
        ),
        (
            "long answers, but a change beyond the edges' reach",
            facts(output=3500, completed=400, running=50),
            facts(output=1200, completed=900, running=50),
            True,
        ),
        (
            "prompts halved with many completions",
            facts(output=300, completed=1500, running=40, prompt=4600),
            facts(output=300, completed=1500, running=40, prompt=2700),
            True,
        ),
        (
            "within the plain limit",
            facts(output=500, completed=2000, running=50),
            facts(output=560, completed=2000, running=50),
            False,
        ),
    ],
)
def test_the_mix_limit_widens_by_the_edges(
    name: str, base: WindowFacts, trial: WindowFacts, drifted: bool
) -> None:
    found = drift(base, trial, trial, S)
    assert bool(found) is drifted, (name, found)


def test_the_message_names_the_widened_limit() -> None:
    base = facts(output=3500, completed=400, running=50)
    trial = facts(output=1200, completed=900, running=50)
    (message,) = drift(base, trial, trial, S)
    assert "output tokens per completed request went from 3500 to 1200 (-66%" in message
    assert "limit ±20% + 9% for requests running at the edges" in message


def test_no_completions_means_no_widening() -> None:
    assert facts(output=1, completed=0, running=50).mix_uncertainty == 0.0
    assert facts(output=1, completed=100, running=50).mix_uncertainty == 0.25
