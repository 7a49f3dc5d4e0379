"""The import graph of the product's modules, as Python runs it when a module is first imported.

An edge a -> b means importing `a` executes `b`: the imports at module level (inside `if`, `try`,
`with` and class bodies too, which run at import time), not those inside functions (they run
later) nor those under `if TYPE_CHECKING:` (they never run) unless asked for. Importing `p.q.r`
executes the packages `p` and `p.q` as well, so they count, except a module's own packages,
which are already running when it is imported. `from p import q` names the module `p.q` when
there is one, else `p`. Asked for `everywhere`, an edge is any import at all, inside functions
too: what a module depends on, whenever it loads it (the package graph, `package_graph.py`).
"""

from __future__ import annotations

import ast
from pathlib import Path


def _modules(repo: Path, roots: tuple[str, ...]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for root in roots:
        if (repo / f"{root}.py").is_file():
            found[root] = repo / f"{root}.py"
        for path in sorted((repo / root).rglob("*.py")) if (repo / root).is_dir() else ():
            parts = list(path.relative_to(repo).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _blocks(node: ast.stmt, type_checking: bool) -> list[list[ast.stmt]]:
    """The statement lists of a compound statement that run when the module is imported."""
    if isinstance(node, ast.If):
        run = type_checking or not _is_type_checking(node)
        return [node.body, node.orelse] if run else [node.orelse]
    if isinstance(node, ast.Try):
        return [node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody]
    if isinstance(node, (ast.With, ast.ClassDef)):
        return [node.body]
    return []


def _from(node: ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> set[str]:
    """`from base import a, b`: the submodules it names, else the module `base` itself."""
    base = node.module or ""
    if node.level:
        here = module.split(".") if is_package else module.split(".")[:-1]
        here = here[: len(here) - node.level + 1]
        base = ".".join([*here, *([node.module] if node.module else [])])
    names = [f"{base}.{alias.name}" for alias in node.names]
    submodules = {name for name in names if name in known}
    return submodules if len(submodules) == len(names) else {*submodules, base}


def _imported(
    body: list[ast.stmt], module: str, is_package: bool, known: set[str], type_checking: bool
) -> set[str]:
    """The modules `body` imports when it runs, resolved against `known`."""
    out: set[str] = set()
    for node in body:
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            out |= _from(node, module, is_package, known)
        for block in _blocks(node, type_checking):
            out |= _imported(block, module, is_package, known, type_checking)
    return out


def _anywhere(tree: ast.Module, module: str, is_package: bool, known: set[str]) -> set[str]:
    """Every module `tree` imports, at any depth (functions included), resolved against `known`."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            out |= _from(node, module, is_package, known)
    return out


def import_graph(
    repo: Path, roots: tuple[str, ...], *, type_checking: bool = False, everywhere: bool = False
) -> dict[str, set[str]]:
    """module -> the product modules importing it executes (see the module docstring)."""
    modules = _modules(repo, roots)
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        own = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 2)}
        edges: set[str] = set()
        is_package = path.name == "__init__.py"
        names = (
            _anywhere(tree, module, is_package, known)
            if everywhere
            else _imported(tree.body, module, is_package, known, type_checking)
        )
        for name in names:
            parts = name.split(".")
            edges.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        graph[module] = {name for name in edges if name in known and name not in own}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: each set of modules that import one another, sorted (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            members = stack[stack.index(node) :]
            del stack[stack.index(node) :]
            if len(members) > 1:
                found.append(sorted(members))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)
