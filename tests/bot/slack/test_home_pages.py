"""The App Home at 500 servers: a summary, a page of items, Previous and Next that show another
page (the page number in the button's value), a garbled or stale value showing page 1; every
page within the tab's 100 blocks. The paging math table by table, then the round trip through
the real Bolt app and the local Slack."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.chat.home import (
    HOME_PAGE,
    PAGE_ITEMS,
    Item,
    page_buttons,
    page_count,
    page_of,
    parse_page,
)
from bot.slack.home import HOME_BLOCKS
from storage import proposals as proposal_store
from storage.db import open_db
from storage.experiments import State, create_experiment, transition
from tests.bot.harness import running_bot
from tests.bot.harness import wait_until as until
from tests.slackfake import FakeSlack


@pytest.mark.parametrize(
    ("value", "page"),
    [
        ("1", 1),
        ("2", 2),
        (" 7 ", 7),
        ("0", 1),
        ("-3", 1),
        ("", 1),
        ("abc", 1),
        ("2.5", 1),
        ("٣", 1),  # a digit to str.isdigit(), not a page number
        ("9" * 40, 1),
        ("2:deadbeef", 1),
    ],
)
def test_a_button_value_reads_as_a_page(value: str, page: int) -> None:
    assert parse_page(value) == page


@pytest.mark.parametrize(
    ("items", "pages"), [(0, 1), (1, 1), (PAGE_ITEMS, 1), (PAGE_ITEMS + 1, 2), (520, 35)]
)
def test_page_count(items: int, pages: int) -> None:
    assert page_count(items) == pages


ITEMS = [Item("server", f"• `s{i}`") for i in range(40)]


@pytest.mark.parametrize(
    ("page", "shown", "first", "size"),
    [
        (1, 1, "• `s0`", PAGE_ITEMS),
        (2, 2, f"• `s{PAGE_ITEMS}`", PAGE_ITEMS),
        (3, 3, f"• `s{2 * PAGE_ITEMS}`", 40 - 2 * PAGE_ITEMS),
        (4, 1, "• `s0`", PAGE_ITEMS),  # stale: the list shrank since the button was drawn
        (0, 1, "• `s0`", PAGE_ITEMS),
    ],
)
def test_page_of(page: int, shown: int, first: str, size: int) -> None:
    got, items = page_of(ITEMS, page)
    assert (got, items[0].line, len(items)) == (shown, first, size)


@pytest.mark.parametrize(
    ("page", "pages", "buttons"),
    [
        (1, 1, []),
        (1, 3, [("next", "2")]),
        (2, 3, [("previous", "1"), ("next", "3")]),
        (3, 3, [("previous", "2")]),
    ],
)
def test_previous_and_next(page: int, pages: int, buttons: list[tuple[str, str]]) -> None:
    got = [(b.action_id, b.value) for b in page_buttons(page, pages)]
    assert got == [(f"{HOME_PAGE}#{which}", value) for which, value in buttons]


# ----------------------------------------------------------------------------- the round trip
SERVERS = 500
PROPOSALS = 20


def fleet_config(tmp_path: Path) -> Path:
    servers = "".join(f'[servers.s{i:03d}]\nurl = "http://127.0.0.1:9"\n' for i in range(SERVERS))
    path = tmp_path / "kvpilot.toml"
    path.write_text(
        '[kvpilot]\n[sampler]\nenabled = false\n[access]\napprovers = ["U2"]\n'
        'operators = ["U1"]\n' + servers
    )
    return path


def store_fleet(db_path: Path) -> None:
    """Proposals waiting, and a failed experiment on s250 (it needs a person)."""
    db = open_db(db_path)
    at = datetime.now(UTC)
    gate = {"baseline_s": 600.0, "max_trial_s": 1800.0, "batch_s": 60.0, "min_effect": 0.03}
    args = ["--mem-fraction-static", "0.85"]
    for i in range(PROPOSALS):
        server = f"s{i:03d}"
        change = {"mem_fraction_static": 0.88}
        proposal_store.create_proposal(
            db, server=server, change=change,
            plan={"server": server, "change": change, "from_args": args,
                  "to_args": ["--mem-fraction-static", "0.88"], "verdict": "possible",
                  "gate": gate, "option": {"verdict": "possible", "reasons": [],
                                           "title": "mem_fraction_static=0.88",
                                           "predicted_max_total_num_tokens": None,
                                           "predicted_throughput_change": None}},
            snapshot={"args": args, "running": 0, "queued": 0}, created_by="U1", now=at,
            expires_at=at + timedelta(hours=2),
        )  # fmt: skip
    exp = create_experiment(
        db, server="s250", change={"mem_fraction_static": 0.9}, baseline_config={"args": []},
        trial_config={"args": []}, settings={}, actor="test", now=at, state=State.reverting,
    )  # fmt: skip
    transition(db, exp, State.failed, actor="test", reason="the revert failed", now=at)
    db.close()


@pytest.fixture
def slack() -> Iterator[FakeSlack]:
    with FakeSlack() as fake:
        yield fake


def page_buttons_of(view: dict[str, Any]) -> dict[str, str]:
    return {
        e["action_id"]: e["value"]
        for b in view["blocks"]
        if b["type"] == "actions"
        for e in b["elements"]
        if e["action_id"].startswith(HOME_PAGE)
    }


def test_the_home_tab_pages_through_500_servers(tmp_path: Path, slack: FakeSlack) -> None:
    config = fleet_config(tmp_path)
    store_fleet(tmp_path / "var" / "kvpilot.db")
    pages = page_count(PROPOSALS + SERVERS)
    with running_bot(config, slack) as (_bot, driver):
        driver.event({"type": "app_home_opened", "user": "U7", "channel": "D1", "tab": "home"})
        view = until(lambda: slack.home("U7"), 30, "the Home tab")
        text = str(view["blocks"])
        assert f"{PROPOSALS} proposal(s) waiting" in text and f"{SERVERS} server(s)" in text
        assert "1 server(s) need attention" in text
        assert f"Page 1 of {pages}" in text and "Proposal 1*" in text
        assert page_buttons_of(view) == {f"{HOME_PAGE}#next": "2"}

        def shown(published: int) -> dict[str, Any]:
            views = until(
                lambda: (
                    len(slack.state.home_views["U7"]) >= published and slack.state.home_views["U7"]
                ),
                30,
                f"view {published}",
            )
            last: dict[str, Any] = views[published - 1]
            return last

        driver.click_home(f"{HOME_PAGE}#next", "2", user="U7")
        second = str(shown(2)["blocks"])
        # the last 5 proposals, then the server that needs a person, then the others
        assert f"Page 2 of {pages}" in second and "Proposal 20*" in second
        assert second.index("Needs attention") < second.index("`s250`: experiment 1 failed")
        assert second.index("`s250`") < second.index("Last verdict per server")
        assert page_buttons_of(shown(2)) == {f"{HOME_PAGE}#previous": "1", f"{HOME_PAGE}#next": "3"}

        driver.click_home(f"{HOME_PAGE}#next", str(pages), user="U7")
        last = shown(3)
        assert f"Page {pages} of {pages}" in str(last["blocks"]) and "`s499`" in str(last)
        assert page_buttons_of(last) == {f"{HOME_PAGE}#previous": str(pages - 1)}

        for n, garbled in enumerate(["abc", "999999", ""], start=4):  # never an exception
            driver.click_home(f"{HOME_PAGE}#next", garbled, user="U7")
            assert f"Page 1 of {pages}" in str(shown(n)["blocks"])

        for published in slack.state.home_views["U7"]:
            assert len(published["blocks"]) <= HOME_BLOCKS
            assert "More: /kvpilot status" not in str(published)  # paged, never cut
    assert slack.violations == []
