"""ARCHITECTURE.md's package graph is the product's imports, as `make map` draws it.

A new package, a new import between packages or a package grown by a hundred lines fails here
until `make map` (`python -m tests.package_graph --write`) is run.
"""

from __future__ import annotations

from pathlib import Path

from tests.package_graph import DOC, current, essential, mermaid, packages, text

FIX = "run `make map` (python -m tests.package_graph --write)"


def test_the_picture_is_up_to_date_with_the_imports() -> None:
    assert current(DOC.read_text()) == mermaid(packages()), f"the package graph is stale: {FIX}"


def _repo(tmp_path: Path, modules: dict[str, str]) -> Path:
    for rel, source in modules.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return tmp_path


def test_packages_are_folders_and_arrows_their_imports(tmp_path: Path) -> None:
    repo = _repo(
        tmp_path,
        {
            "bot/__init__.py": "",
            "bot/app/__init__.py": "",
            "bot/app/config/values.py": "import storage.db\n",
            "bot/chat/flow.py": "import bot.app.config.values\ndef f():\n    import storage.db\n",
            "playbooks/__init__.py": "",
            "playbooks/clock.py": "x = 1\n",
            "storage/__init__.py": "",
            "storage/db.py": "import storage\n",
        },
    )
    found = packages(repo)
    assert sorted(found) == ["bot/app", "bot/chat", "playbooks", "storage"]  # no bare `bot`
    assert found["bot/app"].modules == 2 and found["storage"].modules == 2
    assert found["bot/chat"].imports == {"bot/app", "storage"}  # the lazy import counts
    # bot/chat reaches storage through bot/app: the picture leaves that arrow out, the text not
    assert essential(found)["bot/chat"] == {"bot/app"}
    assert "imports: bot/app, storage" in text(found)
    assert "bot_chat --> storage" not in mermaid(found)


def test_packages_importing_one_another_are_boxed_with_all_their_arrows(tmp_path: Path) -> None:
    repo = _repo(
        tmp_path,
        {
            "bot/app/a.py": "import bot.chat.b\nimport storage.s\n",
            "bot/chat/b.py": "def f():\n    import bot.app.a\nimport storage.s\n",
            "storage/s.py": "",
        },
    )
    drawn = mermaid(packages(repo))
    assert 'subgraph circle1["import one another"]' in drawn
    assert "bot_app --> bot_chat" in drawn and "bot_chat --> bot_app" in drawn
    # both reach storage directly: neither arrow is implied by a package outside their box
    assert "bot_app --> storage" in drawn and "bot_chat --> storage" in drawn
