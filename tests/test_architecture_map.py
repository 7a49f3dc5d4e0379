"""ARCHITECTURE.md's module map is every product module's docstring, as `make map` writes it.

A module left out of the map, or a docstring whose first line changed since the map was made,
fails here until `make map` (`python -m tests.architecture_map --write`) is run; a module
without a docstring fails on its own, since its line in the map would say nothing.
"""

from __future__ import annotations

from pathlib import Path

from tests.architecture_map import (
    DOC,
    NO_DOCSTRING,
    current,
    listed_modules,
    product_modules,
    render,
    stale_lines,
)

FIX = "run `make map` (python -m tests.architecture_map --write)"


def test_every_product_module_has_a_docstring() -> None:
    blank = [line.split()[0] for line in render().splitlines() if line.endswith(NO_DOCSTRING)]
    assert not blank, f"these have no module docstring (a first line saying what they do): {blank}"


def test_every_product_module_is_in_the_map() -> None:
    missing = sorted(set(product_modules()) - listed_modules(current(DOC.read_text())))
    assert not missing, f"ARCHITECTURE.md's module map lacks {missing}: {FIX}"


def test_the_map_is_up_to_date_with_the_docstrings() -> None:
    diff = stale_lines(render(), current(DOC.read_text()))
    assert not diff, f"ARCHITECTURE.md's module map is stale: {FIX}\n" + "\n".join(diff)


def _repo(tmp_path: Path, modules: dict[str, str]) -> Path:
    for rel, doc in modules.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'"""{doc}"""\n')
    return tmp_path


def test_a_new_module_or_a_changed_first_line_makes_the_map_stale(tmp_path: Path) -> None:
    repo = _repo(tmp_path, {"bot/__init__.py": "The bot.", "bot/flow.py": "The flow."})
    made = render(repo)
    assert listed_modules(made) == {"bot/__init__.py", "bot/flow.py"}
    assert not stale_lines(render(repo), made)

    _repo(tmp_path, {"bot/timers.py": "Timers.", "storage/__init__.py": "Storage."})
    assert "storage/__init__.py" not in listed_modules(made)
    assert "+  timers.py  Timers." in stale_lines(render(repo), made)

    made = render(repo)
    _repo(tmp_path, {"bot/flow.py": "The conversation.\n\nMore below the first line."})
    diff = stale_lines(render(repo), made)
    assert "-  flow.py    The flow." in diff
    assert "+  flow.py    The conversation." in diff


def test_a_module_without_a_docstring_is_said_so(tmp_path: Path) -> None:
    repo = _repo(tmp_path, {"bot/__init__.py": "The bot."})
    (repo / "bot" / "bare.py").write_text("X = 1\n")
    assert f"  bare.py  {NO_DOCSTRING}" in render(repo).splitlines()
