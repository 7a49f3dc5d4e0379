"""The package rules of ARCHITECTURE.md, checked on the source.

1. Layering: each package imports only the project packages below it.
2. The engine seam: outside `playbooks/engines/`, product code reaches an engine only through
   `playbooks.engines` (the registry) and `playbooks.engines.base` (the interface), never an
   engine package's own modules, so nothing re-exported from one slips through.
3. The engine's words: outside the engine packages, no product module spells an engine's metric
   names, launch flags or endpoints (each engine lists them: `Engine.vocabulary()`), nor any
   `sglang:` series at all. Argument names such as `mem_fraction_static` may pass through as data.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from playbooks.engines import NAMES, engine_named

REPO = Path(__file__).resolve().parent.parent
# package -> the project packages it may import
ALLOWED = {
    "storage": set(),
    "playbooks": {"storage"},
    "bot": {"playbooks", "storage"},
    "sim": set(),
}
PRODUCT = ("bot", "playbooks", "storage")
ENGINES = "playbooks/engines/"
METRIC_PREFIX = re.compile(r"\bsglang:[a-z_]")


def imported_modules(tree: ast.AST) -> set[str]:
    """Every module an import names, `from a import b` counted as both `a` and `a.b`."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {name.split(".")[0] for name in imported_modules(tree)} & set(ALLOWED)


def product_files() -> list[tuple[str, str]]:
    """(path relative to the repository, text) of every product module outside the engines."""
    out = []
    for package in PRODUCT:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if not rel.startswith(ENGINES):
                out.append((rel, path.read_text()))
    return out


def engine_package_imports(rel: str, text: str) -> list[str]:
    """Imports of an engine package's modules from outside the engine packages."""
    bad = []
    for name in sorted(imported_modules(ast.parse(text, filename=rel))):
        parts = name.split(".")
        if parts[:2] == ["playbooks", "engines"] and len(parts) > 2 and parts[2] in NAMES:
            bad.append(f"{rel} imports {name}: go through playbooks.engines or its base")
    return bad


def vocabulary() -> dict[str, str]:
    """Every engine's own words -> the engine they belong to."""
    words: dict[str, str] = {}
    for name in NAMES:
        for word in engine_named(name).vocabulary():
            words[word] = name
    return words


def engine_words(rel: str, text: str, words: dict[str, str]) -> list[str]:
    bad = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if METRIC_PREFIX.search(line):
            bad.append(f"{rel}:{lineno} spells an SGLang series: {line.strip()}")
            continue
        for word, engine in words.items():
            if re.search(rf"(?<![\w/-]){re.escape(word)}(?![\w-])", line):
                bad.append(f"{rel}:{lineno} spells {engine}'s {word!r}: {line.strip()}")
    return bad


# ----------------------------------------------------------------------------- the rules
@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_follow_the_layering(package: str) -> None:
    bad = []
    for path in sorted((REPO / package).rglob("*.py")):
        for imported in imported_packages(path) - {package} - ALLOWED[package]:
            bad.append(f"{path.relative_to(REPO)} imports {imported}")
    assert not bad, "\n".join(bad)


def test_engines_are_reached_only_through_the_interface() -> None:
    bad = [line for rel, text in product_files() for line in engine_package_imports(rel, text)]
    assert not bad, "\n".join(bad)


def test_only_the_engine_packages_spell_an_engines_words() -> None:
    words = vocabulary()
    bad = [line for rel, text in product_files() for line in engine_words(rel, text, words)]
    assert not bad, "\n".join(bad)


# ----------------------------------------------------------------------------- the rules bite
def test_the_vocabulary_holds_what_it_must() -> None:
    words = vocabulary()
    for word in ("sglang:gen_throughput", "--mem-fraction-static", "--hicache-size", "/v1/loads"):
        assert words.get(word) == "sglang", word


@pytest.mark.parametrize(
    "line",
    [
        'running = metrics.samples.get("sglang:num_running_reqs")',
        'args += ["--mem-fraction-static", "0.9"]',
        '    return http.get("/get_server_info")',
        "# read sglang:token_usage here",
    ],
)
def test_an_engines_word_in_bot_is_caught(line: str) -> None:
    assert engine_words("bot/example.py", f"x = 1\n{line}\n", vocabulary())


@pytest.mark.parametrize(
    "line",
    [
        'change = {"mem_fraction_static": 0.9}',  # an argument's name is data
        'app.route("/healthz")',  # kvpilot's own endpoint, not the engine's /health
        'parser.add_argument("--server")',
    ],
)
def test_data_and_kvpilots_own_words_pass(line: str) -> None:
    assert not engine_words("bot/example.py", line, vocabulary())


@pytest.mark.parametrize(
    "source",
    [
        "from playbooks.engines.sglang.args import ALLOWED",
        "from playbooks.engines.sglang import ENGINE",
        "from playbooks.engines import sglang",
        "import playbooks.engines.sglang.client",
    ],
)
def test_an_engine_module_imported_from_bot_is_caught(source: str) -> None:
    assert engine_package_imports("bot/example.py", source)


@pytest.mark.parametrize(
    "source",
    [
        "from playbooks.engines import engine_named",
        "from playbooks.engines.base import Snapshot",
        "import playbooks.engines",
    ],
)
def test_the_interface_may_be_imported(source: str) -> None:
    assert not engine_package_imports("bot/example.py", source)
