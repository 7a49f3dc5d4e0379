"""[servers.NAME.quality] and [groups.NAME.quality]: checked, with errors that say how to fix
them; a server's own table wins over its group's; the check reaches an experiment's Deps."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.app.config import ConfigError, load
from bot.app.wiring import experiment_deps
from playbooks.clock import ManualClock
from playbooks.engines.base import Prompt
from playbooks.quality.check import URL_VARIABLE, EvalCommand, GoldenPrompts
from storage import memory_db

FLEET = """
[groups.kimi.quality]
lossy_ok = ["kv_cache_dtype"]
command = ["python", "eval.py", "--quick"]
timeout_s = 900

[servers.a]
url = "http://10.0.0.1:30000"
group = "kimi"

[servers.a.quality]
lossy_ok = ["kv_cache_dtype", "kv_cache_dtype"]
prompts = "golden/prompts.jsonl"
max_tokens = 32
min_exact_match = 0.9

[servers.a.launcher]
kind = "process"
command = ["python", "-m", "sglang.launch_server"]

[servers.b]
url = "http://10.0.0.2:30000"
group = "kimi"

[servers.solo]
url = "http://10.0.0.3:8000"
engine = "vllm"
"""
PROMPTS = (
    '{"prompt": "The capital of France is"}\n'
    "\n"
    '{"messages": [{"role": "user", "content": "2 + 2 ="}], "id": "arith"}\n'
)


def write(tmp_path: Path, text: str, prompts: str = PROMPTS) -> str:
    (tmp_path / "golden").mkdir(exist_ok=True)
    (tmp_path / "golden" / "prompts.jsonl").write_text(prompts)
    path = tmp_path / "kvpilot.toml"
    path.write_text(text)
    return str(path)


def test_a_servers_table_wins_over_its_groups(tmp_path: Path) -> None:
    config = load(write(tmp_path, FLEET))
    own = config.server("a").quality
    assert own is not None and own.lossy_ok == ("kv_cache_dtype",)
    assert own.check == GoldenPrompts(
        (Prompt(text="The capital of France is"), Prompt(messages=(("user", "2 + 2 ="),))),
        "golden/prompts.jsonl",
        max_tokens=32,
        min_exact_match=0.9,
    )
    inherited = config.server("b").quality
    assert inherited is not None
    assert inherited.check == EvalCommand(
        ("python", "eval.py", "--quick"), str(tmp_path.resolve()), 900.0
    )
    assert config.server("solo").quality is None  # no table: lossy changes as before
    deps = experiment_deps(config, "a", memory_db(), clock=ManualClock())
    assert deps.quality == own


def test_the_check_survives_its_stored_form(tmp_path: Path) -> None:
    config = load(write(tmp_path, FLEET))
    for name in ("a", "b"):
        check = config.server(name).quality
        assert check is not None
        assert type(check).from_json(check.to_json()) == check
    assert URL_VARIABLE == "KVPILOT_SERVER_URL"  # what the docs promise the eval command


A = "[servers.a.quality]\n"
B = "[groups.kimi.quality]\n"


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (A, A + "minimum = 1\n", r"servers.a.quality: unknown key\(s\) minimum; allowed:"),
        (
            'lossy_ok = ["kv_cache_dtype", "kv_cache_dtype"]\n',
            "",
            r'servers.a.quality.lossy_ok: missing; name the arguments .* lossy_ok = \["kv_',
        ),
        (
            'lossy_ok = ["kv_cache_dtype", "kv_cache_dtype"]\n',
            'lossy_ok = "kv_cache_dtype"\n',
            "servers.a.quality.lossy_ok: expected a non-empty list of argument names",
        ),
        (
            'lossy_ok = ["kv_cache_dtype", "kv_cache_dtype"]\n',
            'lossy_ok = ["kv_dtype"]\n',
            "servers.a.quality.lossy_ok: 'kv_dtype' is not an argument kvpilot changes on "
            "SGLang; use one of .*kv_cache_dtype",
        ),
        (
            'prompts = "golden/prompts.jsonl"\n',
            "",
            "servers.a.quality: neither prompts nor command; give exactly one check",
        ),
        (
            'prompts = "golden/prompts.jsonl"\n',
            'prompts = "golden/prompts.jsonl"\ncommand = ["true"]\n',
            "servers.a.quality: both prompts and command",
        ),
        (
            'prompts = "golden/prompts.jsonl"\n',
            'prompts = "golden/missing.jsonl"\n',
            r"servers.a.quality.prompts: .*golden/missing.jsonl does not exist",
        ),
        ("max_tokens = 32\n", "max_tokens = 0\n", "max_tokens: expected a whole number"),
        ("max_tokens = 32\n", "max_tokens = 3.5\n", "max_tokens: expected a whole number"),
        (
            "min_exact_match = 0.9\n",
            "",
            "golden prompts need a tolerance: min_exact_match .* and/or min_token_overlap",
        ),
        (
            "min_exact_match = 0.9\n",
            "min_exact_match = 90\n",
            r"min_exact_match: a share between 0 and 1 \(0.9 for 90%\), got 90",
        ),
        ("min_exact_match = 0.9\n", "min_token_overlap = 0\n", "must be positive"),
        ("min_exact_match = 0.9\n", 'min_exact_match = "high"\n', "expected a number"),
        (
            'command = ["python", "eval.py", "--quick"]\n',
            'command = "python eval.py --quick"\n',
            r'groups.kimi.quality.command: expected an argument list such as \["python", '
            r'"eval.py"\]; a shell string is not run',
        ),
        (
            'command = ["python", "eval.py", "--quick"]\n',
            'command = ["python", ""]\n',
            "groups.kimi.quality.command: expected a non-empty list of strings",
        ),
        ("timeout_s = 900\n", "timeout_s = -1\n", "groups.kimi.quality.timeout_s: must be"),
        (
            "timeout_s = 900\n",
            "timeout_s = 900\nmax_tokens = 8\n",
            "groups.kimi.quality: max_tokens only apply with prompts, not with command",
        ),
        (
            B + 'lossy_ok = ["kv_cache_dtype"]\ncommand = ["python", "eval.py", "--quick"]\n'
            "timeout_s = 900\n",
            "[groups.kimi]\nquality = 3\n",
            "groups.kimi.quality: expected a table",
        ),
    ],
)
def test_mistakes_are_named(tmp_path: Path, old: str, new: str, message: str) -> None:
    assert old in FLEET
    text = FLEET.replace(old, new, 1)
    with pytest.raises(ConfigError, match=message):
        load(write(tmp_path, text))


def test_a_groups_table_is_checked_for_each_engine_of_its_servers(tmp_path: Path) -> None:
    text = FLEET.replace('engine = "vllm"\n', 'engine = "vllm"\ngroup = "kimi"\n')
    text = text.replace(
        'lossy_ok = ["kv_cache_dtype"]\ncommand', 'lossy_ok = ["hicache_ratio"]\ncommand'
    )
    with pytest.raises(
        ConfigError,
        match=r"groups\.kimi\.quality\.lossy_ok: 'hicache_ratio' is not an argument kvpilot "
        "changes on vLLM",
    ):
        load(write(tmp_path, text))


@pytest.mark.parametrize(
    ("prompts", "message"),
    [
        ("", "holds no prompts"),
        ("not json\n", "line 1 is not JSON"),
        ('{"prompt": "a"}\n[1]\n', "line 2 is not a JSON object"),
        ('{"prompt": "a", "answer": "b"}\n', r"line 1 has unknown key\(s\) answer"),
        ('{"id": "x"}\n', "line 1 needs exactly one of prompt and messages"),
        ('{"prompt": "a", "messages": []}\n', "line 1 needs exactly one of prompt and messages"),
        ('{"prompt": ""}\n', "line 1: prompt must be a non-empty string"),
        ('{"messages": []}\n', "line 1: messages must be a non-empty list"),
        ('{"messages": [{"role": "user"}]}\n', "line 1: message 1 must be an object with"),
        ('{"messages": [{"role": "user", "content": 3}]}\n', "message 1 must be an object"),
    ],
)
def test_a_bad_prompts_file_is_named_by_line(tmp_path: Path, prompts: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"servers.a.quality.prompts: .*{message}"):
        load(write(tmp_path, FLEET, prompts))
