"""The local Slack-compatible server for the Slack front end's tests (a file's own `slack`
fixture, with user groups or scopes of its own, takes precedence)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.slackfake import FakeSlack


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with FakeSlack() as fake:
        yield fake
