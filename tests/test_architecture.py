"""The package rules of ARCHITECTURE.md, checked on the source.

1. Layering: each package imports only the project packages below it.
2. The engine seam: outside `playbooks/engines/`, product code reaches an engine only through
   `playbooks.engines` (the registry) and `playbooks.engines.base` (the interface), never an
   engine package's own modules, so nothing re-exported from one slips through.
3. The engine's words: outside the engine packages, no product module spells an engine's metric
   names, launch flags or endpoints (each engine lists them: `Engine.vocabulary()`), nor any
   `sglang:` or `vllm:` series at all. Argument names such as `mem_fraction_static` may pass
   through as data.
4. Slack stays in `bot/slack/`: no other product module imports `slack_sdk` or `slack_bolt`.
5. The chat core is transport-neutral: `bot/chat/` (and the reports it posts, `bot/reports/`)
   imports no front end (`bot.slack`, `bot.console`, `bot.cli`); a front end implements
   `bot.chat.surface.Surface` and renders `bot.chat.messages.Message` (ARCHITECTURE.md).
6. Slack's ID syntax stays in `bot/slack/`: the chat core, the shared plumbing (the
   configuration included) and the reports spell no Slack ID, mention or prefix test; they ask
   the front end's `bot.chat.identity.Identity`.
7. No import circles among the product modules (`import_graph.py`): a module's import-time
   imports, and those under `if TYPE_CHECKING:`, never lead back to it (a type one module
   needs of another that imports it is declared where both can import it: a protocol such as
   `bot.chat.conversation.Conversation`). The seam's own modules (`playbooks/engines/base.py`,
   `types.py`) import nothing of the playbooks that use them, not even for type checking.
8. A product module over 500 lines says why in its docstring ("Why it is long: ..."): a long
   module is a choice, not an accident.

Imports inside functions (the lazy, heavy ones) count like any other in rules 1 to 6.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

from playbooks.engines import NAMES, engine_named
from tests.import_graph import cycles, import_graph

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
SLACK_PACKAGES = ("slack_sdk", "slack_bolt")
SLACK_FRONT_END = "bot/slack/"
FRONT_ENDS = ("bot.slack", "bot.console", "bot.cli")
TRANSPORT_NEUTRAL = ("bot/chat/", "bot/reports/")
METRIC_PREFIX = re.compile(r"\b(sglang|vllm):[a-z_]")
ID_NEUTRAL = ("bot/chat/", "bot/app/", "bot/reports/")
SLACK_SYNTAX = re.compile(
    r"<[@#]"  # a mention of a person or a channel
    r"|<!(subteam|here|channel|everyone)"  # of a group, of everyone
    r"|\[[UWSCGD]{2,}\]"  # a regex's class of Slack's prefixes, [UW]
    r"|startswith\(\s*[\"'][UWSCGD][\"']"  # a prefix test, .startswith("S")
    r"|[\"'](UWS|UW|CG)[\"']"  # a set of prefixes
    r"|\b[UWSCGD]0[0-9A-Z]{4,}\b"  # an ID such as U0123ABCD
)


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


def all_product_files() -> list[tuple[str, str]]:
    """(path relative to the repository, text) of every product module, engines included."""
    return [
        (path.relative_to(REPO).as_posix(), path.read_text())
        for package in PRODUCT
        for path in sorted((REPO / package).rglob("*.py"))
    ]


def slack_imports(rel: str, text: str) -> list[str]:
    """Imports of Slack's libraries from outside `bot/slack/`."""
    if rel.startswith(SLACK_FRONT_END):
        return []
    return [
        f"{rel} imports {name}: Slack is reached only through bot/slack"
        for name in sorted(imported_modules(ast.parse(text, filename=rel)))
        if name.split(".")[0] in SLACK_PACKAGES
    ]


def front_end_imports(rel: str, text: str) -> list[str]:
    """Imports of a front end from the transport-neutral chat core."""
    if not rel.startswith(TRANSPORT_NEUTRAL):
        return []
    return [
        f"{rel} imports {name}: the chat core reaches a front end only through Surface"
        for name in sorted(imported_modules(ast.parse(text, filename=rel)))
        if any(name == f or name.startswith(f + ".") for f in FRONT_ENDS)
    ]


# Paths the bot serves itself: Prometheus's conventional /metrics is also an engine's, but the
# bot's own endpoint of that name is not a reach into the engine.
KVPILOTS_OWN = frozenset({"/metrics"})


def vocabulary() -> dict[str, str]:
    """Every engine's own words -> the engine they belong to."""
    words: dict[str, str] = {}
    for name in NAMES:
        for word in engine_named(name).vocabulary() - KVPILOTS_OWN:
            words[word] = name
    return words


@functools.lru_cache(maxsize=8)
def _words_pattern(words: tuple[str, ...]) -> re.Pattern[str]:
    """One pattern for the whole vocabulary: a search per word and line took 27 s."""
    ordered = sorted(words, key=len, reverse=True)  # the longest spelling wins at a position
    return re.compile(rf"(?<![\w/-])(?:{'|'.join(map(re.escape, ordered))})(?![\w-])")


def engine_words(rel: str, text: str, words: dict[str, str]) -> list[str]:
    bad = []
    pattern = _words_pattern(tuple(words))
    for lineno, line in enumerate(text.splitlines(), 1):
        if METRIC_PREFIX.search(line):
            bad.append(f"{rel}:{lineno} spells an engine's series: {line.strip()}")
            continue
        for word in dict.fromkeys(m.group(0) for m in pattern.finditer(line)):
            bad.append(f"{rel}:{lineno} spells {words[word]}'s {word!r}: {line.strip()}")
    return bad


def slack_syntax(rel: str, text: str) -> list[str]:
    """Lines of the ID-neutral packages that spell Slack's ID syntax."""
    if not rel.startswith(ID_NEUTRAL):
        return []
    return [
        f"{rel}:{lineno} spells Slack's ID syntax (ask the front end's Identity): {line.strip()}"
        for lineno, line in enumerate(text.splitlines(), 1)
        if SLACK_SYNTAX.search(line)
    ]


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


def test_only_the_slack_front_end_imports_slack() -> None:
    bad = [line for rel, text in all_product_files() for line in slack_imports(rel, text)]
    assert not bad, "\n".join(bad)


def test_the_chat_core_imports_no_front_end() -> None:
    bad = [line for rel, text in all_product_files() for line in front_end_imports(rel, text)]
    assert not bad, "\n".join(bad)


def test_only_the_slack_front_end_spells_slack_ids() -> None:
    bad = [line for rel, text in all_product_files() for line in slack_syntax(rel, text)]
    assert not bad, "\n".join(bad)


def test_no_import_circles_among_product_modules() -> None:
    found = cycles(import_graph(REPO, PRODUCT, type_checking=True))
    assert not found, "\n".join(" -> ".join(cycle) for cycle in found)


SEAM = ("playbooks.engines.base", "playbooks.engines.types")


def test_the_seam_imports_no_playbook_that_uses_it() -> None:
    """Counting type-checking imports too: the interface's types are the engines' own."""
    graph = import_graph(REPO, PRODUCT, type_checking=True)
    bad = [
        f"{module} imports {imported}"
        for module in SEAM
        for imported in sorted(graph[module])
        if not imported.startswith(("playbooks.engines", "playbooks.stats", "playbooks.sources"))
    ]
    assert not bad, "\n".join(bad)


LONG_MODULE_LINES = 500
WHY_LONG = "Why it is long:"


def unexplained_length(rel: str, text: str) -> str | None:
    """`rel` and its length where it is over LONG_MODULE_LINES without a stated reason."""
    lines = text.count("\n")
    if lines <= LONG_MODULE_LINES:
        return None
    doc = ast.get_docstring(ast.parse(text, filename=rel)) or ""
    return None if WHY_LONG in doc else f"{rel}: {lines} lines"


def test_a_long_module_says_why_it_is_long() -> None:
    bad = [found for rel, text in all_product_files() if (found := unexplained_length(rel, text))]
    assert not bad, f"split these or say why in their docstrings ({WHY_LONG!r}):\n" + "\n".join(bad)


def test_an_unexplained_long_module_is_caught() -> None:
    body = "x = 1\n" * (LONG_MODULE_LINES + 1)
    assert unexplained_length("bot/x.py", '"""A module."""\n' + body) == "bot/x.py: 502 lines"
    explained = f'"""A module.\n\n{WHY_LONG} a table.\n"""\n' + body
    assert unexplained_length("bot/x.py", explained) is None


# ----------------------------------------------------------------------------- the rules bite
@pytest.mark.parametrize(
    ("engine", "words"),
    [
        (
            "sglang",
            ("sglang:gen_throughput", "--mem-fraction-static", "--hicache-size", "/v1/loads"),
        ),
        ("vllm", ("vllm:kv_cache_usage_perc", "--gpu-memory-utilization", "--no-enforce-eager")),
        ("vllm", ("vllm:cache_config_info", "--device-memory-utilization", "/version")),
    ],
)
def test_the_vocabulary_holds_what_it_must(engine: str, words: tuple[str, ...]) -> None:
    vocabulary = engine_named(engine).vocabulary()
    for word in words:
        assert word in vocabulary, word


@pytest.mark.parametrize(
    "line",
    [
        'running = metrics.samples.get("sglang:num_running_reqs")',
        'args += ["--mem-fraction-static", "0.9"]',
        '    return http.get("/get_server_info")',
        "# read sglang:token_usage here",
        'usage = metrics.get("vllm:kv_cache_usage_perc")',
        'args += ["--gpu-memory-utilization", "0.95"]',
        "# vllm:num_preemptions_total counts them",
    ],
)
def test_an_engines_word_in_bot_is_caught(line: str) -> None:
    assert engine_words("bot/example.py", f"x = 1\n{line}\n", vocabulary())


@pytest.mark.parametrize(
    "line",
    [
        'change = {"mem_fraction_static": 0.9}',  # an argument's name is data
        'app.route("/healthz")',  # kvpilot's own endpoint, not the engine's /health
        'Route("/metrics", metrics)',  # kvpilot's own /metrics
        'parser.add_argument("--server")',
    ],
)
def test_data_and_kvpilots_own_words_pass(line: str) -> None:
    assert not engine_words("bot/example.py", line, vocabulary())


@pytest.mark.parametrize(
    "source",
    [
        "from playbooks.engines.sglang.allow_list import ALLOWED",
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


LAZY = "def render() -> None:\n    {}\n"


@pytest.mark.parametrize(
    ("rel", "source"),
    [
        ("bot/chat/messages.py", "from slack_sdk.models.blocks import SectionBlock"),
        ("bot/chat/surface.py", "import slack_sdk"),
        ("bot/reports/report.py", LAZY.format("from slack_sdk import WebClient")),
        ("bot/cli/report.py", LAZY.format("from slack_sdk.errors import SlackApiError")),
        ("bot/console/terminal.py", "from slack_bolt import App"),
        ("playbooks/gate.py", "import slack_bolt.adapter.socket_mode"),
    ],
)
def test_a_slack_import_outside_bot_slack_is_caught(rel: str, source: str) -> None:
    assert slack_imports(rel, source)


@pytest.mark.parametrize(
    "source",
    ["from slack_sdk import WebClient", LAZY.format("from slack_bolt import App")],
)
def test_bot_slack_may_import_slack(source: str) -> None:
    assert not slack_imports("bot/slack/surface.py", source)


@pytest.mark.parametrize(
    ("rel", "source"),
    [
        ("bot/chat/flow.py", "from bot.slack.surface import SlackSurface"),
        ("bot/chat/runner.py", "import bot.console.terminal"),
        ("bot/chat/flow.py", "from bot import cli"),
        ("bot/chat/messages.py", LAZY.format("from bot.slack.blocks import blocks")),
        ("bot/reports/schedule.py", LAZY.format("from bot.slack.surface import SlackSurface")),
    ],
)
def test_a_front_end_imported_from_the_chat_core_is_caught(rel: str, source: str) -> None:
    assert front_end_imports(rel, source)


@pytest.mark.parametrize(
    ("rel", "source"),
    [
        ("bot/chat/flow.py", "from bot.chat.surface import Surface"),
        ("bot/chat/flow.py", "from bot.app.config import Config"),
        ("bot/chat/flow.py", "import bot.slackware"),  # a name that merely starts alike
        ("bot/cli/report.py", LAZY.format("from bot.slack.surface import SlackSurface")),
        ("bot/slack/app.py", "from bot.chat.flow import Kvpilot"),
    ],
)
def test_the_chat_core_and_front_ends_may_import_what_they_need(rel: str, source: str) -> None:
    assert not front_end_imports(rel, source)


@pytest.mark.parametrize(
    ("rel", "line"),
    [
        ("bot/chat/auth.py", '        if entry.startswith("S"):'),
        ("bot/chat/auth.py", '    allowed = ", ".join(f"<#{c}>" for c in channels)'),
        ("bot/chat/render.py", '    return f"<@{user}>"'),
        ("bot/reports/report.py", '    text = f"<!subteam^{group}> the report"'),
        ("bot/app/config/values.py", 'USER = re.compile(r"[UW][A-Z0-9]+")'),
        ("bot/app/config/access.py", '    slack_ids(table, key, where, "UWS")'),
        ("bot/app/config/access.py", "    'a Slack user ID like \"U0123ABCD\"'"),
    ],
)
def test_slack_id_syntax_in_the_core_is_caught(rel: str, line: str) -> None:
    assert slack_syntax(rel, f"x = 1\n{line}\n")


@pytest.mark.parametrize(
    ("rel", "line"),
    [
        ("bot/slack/identity.py", '        return channel.startswith("D")'),
        ("bot/slack/blocks.py", '    return f"<@{user}>"'),
        ("bot/chat/auth.py", "    return ids.is_private(where)"),
        ("bot/chat/flow.py", '    """`[slack] channels` limits where commands are typed."""'),
        ("bot/app/config/values.py", 'raise ConfigError(f"{where}: expected a list of IDs")'),
    ],
)
def test_the_front_end_and_neutral_words_pass(rel: str, line: str) -> None:
    assert not slack_syntax(rel, line)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"a.py": "import b", "b.py": "from a import x"}, [["a", "b"]]),
        ({"p/__init__.py": "from p.q import y", "p/q.py": "import r", "r.py": "import p.s"}, 1),
        ({"a.py": "import b", "b.py": "def f():\n    import a"}, []),  # lazy: not at import
        (
            {
                "a.py": "import b",
                "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a",
            },
            [],
        ),
        ({"p/__init__.py": "from p import q", "p/q.py": "from p import r", "p/r.py": ""}, []),
    ],
)
def test_an_import_circle_is_caught(
    tmp_path: Path, files: dict[str, str], expected: object
) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = cycles(import_graph(tmp_path, ("a", "b", "p", "r")))
    assert (len(found) if isinstance(expected, int) else found) == expected


def test_an_import_circle_through_type_checking_is_caught(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("import b")
    (tmp_path / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a"
    )
    assert cycles(import_graph(tmp_path, ("a", "b"), type_checking=True)) == [["a", "b"]]
