"""The package import rules of ARCHITECTURE.md, checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# package -> the project packages it may import
ALLOWED = {
    "storage": set(),
    "playbooks": {"storage"},
    "bot": {"playbooks", "storage"},
    "sim": set(),
}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & set(ALLOWED)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_follow_the_layering(package: str) -> None:
    bad = []
    for path in sorted((REPO / package).rglob("*.py")):
        for imported in imported_packages(path) - {package} - ALLOWED[package]:
            bad.append(f"{path.relative_to(REPO)} imports {imported}")
    assert not bad, "\n".join(bad)
