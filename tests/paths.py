"""Where the repository and the recorded fixtures are, for tests at any depth."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
