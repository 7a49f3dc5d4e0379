"""`[groups.NAME.router]`: read, checked with errors that say how to fix them, wired to the
experiment's rotation (and to the proposal's risk line)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.app.config import Config, ConfigError, load
from bot.app.wiring import rotation
from bot.chat.routing import drain_text
from playbooks.routers.sglang import SGLangRouter
from playbooks.routers.vllm_stack import VllmStackRouter

SERVERS = """
[servers.a]
url = "http://10.0.0.1:30000"
group = "kimi"

[servers.b]
url = "http://10.0.0.2:30000"
group = "kimi"

[servers.solo]
url = "http://10.0.0.3:30000"
"""


def load_with(tmp_path: Path, router: str) -> Config:
    path = tmp_path / "kvpilot.toml"
    path.write_text(f"[groups.kimi]\n{router}\n{SERVERS}")
    return load(str(path))


def test_an_sglang_router_and_its_workers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROUTER_KEY", "k")
    config = load_with(tmp_path, '[groups.kimi.router]\nkind = "sglang"\n'
                       'url = "http://10.0.0.9:30000/"\ndrain_timeout_s = 90\n'
                       'api_key_env = "ROUTER_KEY"\n[groups.kimi.router.workers]\n'
                       'b = "http://b.internal:30000"\n')  # fmt: skip
    router = config.groups["kimi"].router
    assert router is not None
    assert (router.kind, router.url, router.drain_timeout_s, router.api_key) == (
        "sglang", "http://10.0.0.9:30000", 90.0, "k",
    )  # fmt: skip
    a = rotation(config, config.server("a"))
    b = rotation(config, config.server("b"))
    assert a is not None and isinstance(a.router, SGLangRouter)
    assert (a.worker, b.worker if b else None) == (
        "http://10.0.0.1:30000",
        "http://b.internal:30000",
    )
    assert a.drain_timeout_s == 90.0 and a.group == "kimi"
    assert rotation(config, config.server("solo")) is None
    assert "leaves the rotation of the sglang router" in (drain_text(config, "a") or "")
    assert drain_text(config, "solo") is None


def test_a_vllm_stack_router(tmp_path: Path) -> None:
    table = 'kind = "vllm_stack"\nurl = "http://r:8000"\nconfig_file = "/etc/router/dynamic.json"'
    config = load_with(tmp_path, f"[groups.kimi.router]\n{table}\n")
    found = rotation(config, config.server("a"))
    assert found is not None and isinstance(found.router, VllmStackRouter)
    assert str(found.router.config_file) == "/etc/router/dynamic.json"


@pytest.mark.parametrize(
    ("table", "error"),
    [
        ('url = "http://r:1"', "router.kind: missing; say which router is in front"),
        ('kind = "nginx"\nurl = "http://r:1"',
         "'nginx' is not a router kvpilot knows; use \"sglang\""),
        ('kind = "sglang"', "router.url: expected the router's address"),
        ('kind = "sglang"\nurl = "r:1"', "router.url: expected the router's address"),
        ('kind = "vllm_stack"\nurl = "http://r:1"',
         "router.config_file: missing; vLLM's production-stack router has no API"),
        ('kind = "sglang"\nurl = "http://r:1"\nconfig_file = "x.json"',
         'config_file: only for kind = "vllm_stack"'),
        ('kind = "vllm_stack"\nurl = "http://r:1"\nconfig_file = "x"\napi_key_env = "K"',
         'api_key_env: only for kind = "sglang"'),
        ('kind = "sglang"\nurl = "http://r:1"\napi_key_env = "KVPILOT_NO_SUCH_VAR"',
         "the environment variable KVPILOT_NO_SUCH_VAR is not set"),
        ('kind = "sglang"\nurl = "http://r:1"\ndrain_timeout_s = 0',
         "drain_timeout_s: must be positive"),
        ('kind = "sglang"\nurl = "http://r:1"\nworkers = { solo = "http://x:1" }',
         "workers.solo: not a server of this group (its servers: a, b)"),
        ('kind = "sglang"\nurl = "http://r:1"\nworkers = { a = "x:1" }',
         "workers.a: expected the URL the router knows it by"),
        ('kind = "sglang"\nurl = "http://r:1"\nport = 1', "unknown key(s) port"),
    ],
)  # fmt: skip
def test_router_mistakes_say_how_to_fix_them(tmp_path: Path, table: str, error: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_with(tmp_path, f"[groups.kimi.router]\n{table}\n")
    assert error in str(caught.value) and "groups.kimi.router" in str(caught.value)
