"""Hypothesis profiles for the fuzz tier, and a tally of the inputs each target was given.

`make test` runs the `quick` profile: derandomized (the same inputs every run, so a failure is
reproducible from the log) and bounded, under a minute for the whole tier. `make fuzz` runs
`long` (KVPILOT_FUZZ=long): random seeds and many more inputs per target; the tally it prints
at the end is what RELIABILITY.md quotes.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

SUPPRESSED = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile(
    "quick", max_examples=60, derandomize=True, deadline=None, suppress_health_check=SUPPRESSED
)
settings.register_profile("long", deadline=None, suppress_health_check=SUPPRESSED)
PROFILE = os.environ.get("KVPILOT_FUZZ", "quick")
settings.load_profile(PROFILE)

TALLY: Counter[str] = Counter()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A failing input of megabytes is reported by its exception, not its full repr."""
    for item in items:
        if "tests/fuzz/" in str(item.fspath):
            item.add_marker(pytest.mark.filterwarnings("ignore:Generating overly large repr"))


def tally(target: str) -> None:
    """Count one input given to `target` (a category of RELIABILITY.md's table)."""
    TALLY[target] += 1


@pytest.fixture(scope="session", autouse=True)
def _report_tally() -> Iterator[None]:
    yield
    if TALLY:
        width = max(map(len, TALLY))
        lines = [f"  {name:<{width}}  {count:>8,}" for name, count in sorted(TALLY.items())]
        total = f"  {'total':<{width}}  {sum(TALLY.values()):>8,}"
        print(f"\nfuzz inputs ({PROFILE} profile):\n" + "\n".join([*lines, total]))


def scaled(quick: int, long: int) -> int:
    """`quick` examples in `make test`, `long` in `make fuzz` (sized so the whole long run
    gives over 100,000 inputs in about 25 minutes on two cores)."""
    return quick if PROFILE == "quick" else long
