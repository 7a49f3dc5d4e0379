"""Clause 6 of the launcher contract, the bot killed after every kind of step, on every launcher.

Apart from test_contract.py so that the parallel tier runs the two files side by side.
"""

from __future__ import annotations

from tests.playbooks.launchers import contract
from tests.playbooks.launchers.harness import Harness


def test_killed_in_every_state(system: Harness) -> None:
    contract.killed_in_every_state(system)
