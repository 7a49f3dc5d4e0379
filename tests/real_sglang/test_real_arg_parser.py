"""Real SGLang 0.5.23 takes every server-argument edit kvpilot can emit, with the value kvpilot
meant, and refuses what kvpilot refuses, except where kvpilot is stricter for a reason named in
`EXPLAINED`.

The edits are generated in tests/arg_cases.py (seeded; the twin gets the same ones in
tests/conformance/test_twin_arg_types.py) and go through kvpilot's parse_change and
with_change. All of them then go through SGLang's own parser, ServerArgs construction,
resolution and start-up checks in one process of the SGLang venv (check_args.py), on the
command line launch.py gives a real server. Last, one real server per kind of value (int, float,
store_true flag, choice) starts with arguments from with_change and reports the values in
/server_info.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from playbooks.engines.sglang.allow_list import ALLOWED, parse_change, with_change
from tests.arg_cases import (
    BASELINE,
    SGLANG_0523,
    Edit,
    Refusal,
    accepted_edits,
    refused_combinations,
    refused_values,
    sglang_parses,
)

from . import launch
from .harness import RealSGLang, sglang_env_available

pytestmark = [
    pytest.mark.real_sglang,
    pytest.mark.slow,
    pytest.mark.skipif(
        not sglang_env_available(),
        reason="real SGLang environment not installed (run tests/real_sglang/setup.sh)",
    ),
]

HERE = Path(__file__).resolve().parent
# The simulated GPU of the other real-tier tests: SGLang picks its defaults (chunked prefill
# 8192, ...) from it, and those defaults are what an edit is checked against.
SIM_ENV = {
    "KVPILOT_SIM_GPU_GIB": "141",
    "KVPILOT_SIM_WEIGHTS_GIB": "15",
    "KVPILOT_SIM_OVERHEAD_GIB": "1.4",
}
# The bug this module guards against: SGLang declares --hicache-size type=int.
FLOAT_HICACHE_SIZE = (
    *with_change(list(BASELINE), {"hicache_size": None}),
    "--hicache-size",
    "40.0",
)

_INT32 = (
    "SGLang's argparse takes any Python int, but token slots live in int32 tensors "
    "(mem_cache/memory_pool.py req_to_token), so a count past 2**31 - 1 is never meaningful"
)
_SUFFIX = (
    "SGLang's human_readable_int reads 4k as 4000; kvpilot asks for the plain number so that a "
    "value is spelt one way in proposals, the audit log and the command line"
)
_MFS_LOW = (
    "a share of GPU memory, and SGLang checks no range (a bare float): at 0 or below nothing is "
    "left for weights and the KV pool, and the server fails only after loading the weights"
)
_MFS_HIGH = (
    "at 1 or above the static pool claims all of the GPU memory or more, leaving nothing for "
    "activations and CUDA graphs; SGLang checks no range"
)
_NOT_FINITE = (
    "nan and inf pass float() and SGLang checks nothing more; a memory share or a pool ratio of "
    "nan or inf has no meaning"
)
_RATIO_HIGH = (
    "a bound against typing slips: a GPU pool of tens of GB times 100 is terabytes of pinned host "
    "RAM (diagnose proposes at most 2x); SGLang checks host memory only when it allocates the "
    "pool, after loading the weights"
)

# (allow-list entry, kind of refusal) -> why kvpilot refuses what SGLang 0.5.23 accepts.
EXPLAINED: dict[tuple[str, str], str] = {
    ("mem_fraction_static", "at the open lower bound"): _MFS_LOW,
    ("mem_fraction_static", "below the range"): _MFS_LOW,
    ("mem_fraction_static", "at the open upper bound"): _MFS_HIGH,
    ("mem_fraction_static", "above the range"): _MFS_HIGH,
    ("mem_fraction_static", "not finite"): _NOT_FINITE,
    ("max_total_tokens", "zero"): "a KV pool capped at no tokens holds no request; SGLang "
    "checks no range",
    ("max_total_tokens", "negative"): "a KV pool capped below zero tokens; SGLang checks no range",
    ("max_total_tokens", "above the maximum"): _INT32,
    ("max_total_tokens", "SI suffix"): _SUFFIX,
    ("max_running_requests", "zero"): "no request could ever run; SGLang checks no range",
    ("max_running_requests", "negative"): "no request could ever run; SGLang checks no range",
    ("max_running_requests", "above the maximum"): _INT32,
    ("chunked_prefill_size", "zero"): "SGLang's scheduler reads every value <= 0 as chunking off "
    "(managers/scheduler.py); kvpilot keeps -1, the documented spelling, so the one setting is "
    "never written two ways",
    ("chunked_prefill_size", "below -1"): "SGLang's scheduler reads every value <= 0 as chunking "
    "off; kvpilot keeps -1, the documented spelling",
    ("chunked_prefill_size", "above the maximum"): _INT32,
    ("max_prefill_tokens", "zero"): "a prefill batch of no tokens; SGLang checks no range",
    ("max_prefill_tokens", "negative"): "a prefill batch below zero tokens; SGLang checks no range",
    ("max_prefill_tokens", "above the maximum"): _INT32,
    ("max_prefill_tokens", "SI suffix"): _SUFFIX,
    ("schedule_conservativeness", "at the open lower bound"): "SGLang asserts only >= 0 "
    "(validation_hook.py); at 0 the initial new-token ratio min(0.7 x value, 1.0) is 0, so "
    "admission reserves no room for the tokens running requests will still generate",
    ("schedule_conservativeness", "above the range"): "the value only scales the initial "
    "new-token ratio, min(SGLANG_INIT_NEW_TOKEN_RATIO x value, 1.0) (scheduler_components/"
    "new_token_ratio_tracker.py), which saturates at 1.43 with the default 0.7 and at 10 for a "
    "factor as low as 0.1: a larger value changes nothing",
    ("schedule_conservativeness", "not finite"): "inf passes float() and the >= 0 assertion "
    "(nan does not); it only saturates the ratio",
    ("hicache_ratio", "at the open lower bound"): "a host pool of no size; SGLang checks no range "
    "and only warns when the host pool is smaller than the GPU pool",
    ("hicache_ratio", "below the range"): "a host pool of negative size; SGLang checks no range",
    ("hicache_ratio", "at the open upper bound"): _RATIO_HIGH,
    ("hicache_ratio", "above the range"): _RATIO_HIGH,
    ("hicache_ratio", "not finite"): _NOT_FINITE,
    ("schedule_policy", "SGLang-only choice"): "kvpilot proposes lpm for prefix-heavy work and "
    "fcfs to go back; the others change fairness (random, dfs-weight, lof, hrrn, "
    "shortest-prefill-first) or need other settings (priority needs "
    "--enable-priority-scheduling, routing-key a router), and kvpilot has no rule for them",
    ("cuda_graph_max_bs_decode", "zero"): "no decode batch would be captured; SGLang checks no "
    "range here (memory_hook.py then sizes graphs and the reserve from it)",
    ("cuda_graph_max_bs_decode", "negative"): "a negative batch size; SGLang checks no range",
    ("cuda_graph_max_bs_decode", "above the maximum"): "graphs past 4,096 requests per rank: "
    "kvpilot proposes graphs that cover the measured decode batch, and SGLang's own defaults "
    "stop at 512",
    ("hicache_size", "negative"): "SGLang uses the size only when it is > 0 (hicache_hook.py), "
    "so a negative size silently means 'use the ratio'; kvpilot keeps 0 for that",
    ("hicache_size", "above the maximum"): "over 10 TB of host RAM per rank; SGLang finds out "
    "only when it allocates the pool, after loading the weights",
}


@dataclass(frozen=True)
class Checked:
    declared: dict[str, Any]
    edits: list[tuple[Edit, dict[str, Any]]]
    refusals: list[tuple[Refusal, dict[str, Any]]]
    float_hicache_size: dict[str, Any]
    seconds: float


@pytest.fixture(scope="module")
def checked() -> Checked:
    """Every case through real SGLang's argument handling, in one process of its venv."""
    edits = accepted_edits()
    refusals = [*refused_values(), *refused_combinations()]
    python = launch.venv_python()
    model = launch.model_dir()
    launch.ensure_model(python, model)  # returns at once when setup.sh has built it
    argvs = [list(e.args) for e in edits] + [list(r.args) for r in refusals]
    argvs.append(list(FLOAT_HICACHE_SIZE))
    job = {
        "flags": sorted(ALLOWED),
        "warmup": launch.with_defaults(list(BASELINE), model),
        "cases": [launch.with_defaults(argv, model) for argv in argvs],
    }
    env = {**os.environ, **launch.shim_env(os.environ), **SIM_ENV}
    with tempfile.TemporaryDirectory(prefix="kvpilot-args-") as tmp:
        job_path, out_path = Path(tmp) / "in.json", Path(tmp) / "out.json"
        job_path.write_text(json.dumps(job))
        began = time.monotonic()
        proc = subprocess.run(
            [str(python), str(HERE / "check_args.py"), str(job_path), str(out_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        seconds = time.monotonic() - began
        assert proc.returncode == 0, proc.stderr[-4000:]
        out = json.loads(out_path.read_text())
    results = out["results"]
    assert len(results) == len(argvs)
    print(f"\n{len(argvs)} command lines through SGLang's argument handling in {seconds:.1f} s")
    return Checked(
        declared=out["declared"],
        edits=list(zip(edits, results[: len(edits)], strict=True)),
        refusals=list(zip(refusals, results[len(edits) : -1], strict=True)),
        float_hicache_size=results[-1],
        seconds=seconds,
    )


def test_the_declarations_kvpilot_relies_on_are_sglangs(checked: Checked) -> None:
    """SGLANG_0523 (which the fast twin check uses) is what the real parser declares."""
    assert set(SGLANG_0523) == set(ALLOWED) == set(checked.declared)
    for name, want in SGLANG_0523.items():
        got = checked.declared[name]
        assert tuple(got["option_strings"]) == want.option_strings, name
        assert got["type_name"] == want.type_name, name
        assert (tuple(got["choices"]) if got["choices"] else None) == want.choices, name
        assert got["default"] == want.default, name
        assert (got["action"] == "_StoreTrueAction") == (want.type_name is None), name


def test_sglang_refuses_a_float_hicache_size(checked: Checked) -> None:
    result = checked.float_hicache_size
    assert not result["accepted"] and result["stage"] == "parse"
    assert "argument --hicache-size: invalid int value: '40.0'" in result["error"]


def test_every_edit_kvpilot_emits_is_accepted_with_its_value(checked: Checked) -> None:
    refused = [(e.items, r["stage"], r["error"]) for e, r in checked.edits if not r["accepted"]]
    assert not refused, "SGLang refuses edits kvpilot emits:\n" + "\n".join(map(str, refused))
    wrong = []
    for edit, result in checked.edits:
        for name, value in edit.change.items():
            parsed, resolved = result["parsed"][name], result["resolved"][name]
            if parsed != value or type(parsed) is not type(value) or resolved != value:
                wrong.append((edit.items, name, value, parsed, resolved))
    assert not wrong, "SGLang reads other values:\n" + "\n".join(map(str, wrong))
    per_key = Counter(edit.key for edit, _ in checked.edits)
    assert all(per_key[name] >= 4 for name in ALLOWED), per_key


def test_every_refusal_is_sglangs_or_explained(checked: Checked) -> None:
    accepted = {(r.key, r.why) for r, res in checked.refusals if res["accepted"]}
    unexplained = sorted(
        (r.key, r.text, r.why)
        for r, res in checked.refusals
        if res["accepted"]
        if (r.key, r.why) not in EXPLAINED
    )
    assert not unexplained, (
        "kvpilot refuses values SGLang accepts, with no reason in EXPLAINED:\n"
        + "\n".join(map(str, unexplained))
    )
    stale = sorted(set(EXPLAINED) - accepted)
    assert not stale, f"SGLang now refuses these itself; drop them from EXPLAINED: {stale}"
    assert {r.key for r, _ in checked.refusals} >= set(ALLOWED)


def test_the_parse_rule_the_twin_is_held_to_is_sglangs(checked: Checked) -> None:
    """sglang_parses, which tests/conformance/test_twin_arg_types.py holds the twin to, says
    exactly which refused values SGLang's argparse itself refuses."""
    wrong = [
        (r.key, r.text, res.get("stage"), res.get("error"))
        for r, res in checked.refusals
        if r.key in SGLANG_0523
        and sglang_parses(r.key, r.text) == (not res["accepted"] and res["stage"] == "parse")
    ]
    assert not wrong, "\n".join(map(str, wrong))


# Every kind of value kvpilot writes (int, float, a store_true flag, a choice), each kind with
# several edits, put through one server start: each start costs over 20 s on two cores.
# hicache_size is the int that was once spelt 40.0; it turns the flag on by itself.
EDITS = {
    "int": [
        "max_total_tokens=30000",
        "max_running_requests=48",
        "page_size=16",
        "chunked_prefill_size=4096",
        "max_prefill_tokens=8192",
    ],
    "float": ["mem_fraction_static=0.85", "schedule_conservativeness=0.5"],
    "store_true flag": ["enable_hierarchical_cache=yes", "hicache_size=1"],
    "choice": ["kv_cache_dtype=fp8_e4m3", "hicache_write_policy=write_back"],
}


def test_a_real_server_starts_with_the_edits_and_reports_them() -> None:
    change = parse_change([edit for edits in EDITS.values() for edit in edits])
    args = with_change(list(BASELINE), change)
    with RealSGLang.start(None, args, SIM_ENV, timeout=180) as server, server.client() as client:
        info = client.get("/server_info").json()
    wrong = [
        (name, value, info.get(name))
        for name, value in change.items()
        if info.get(name) != value or type(info.get(name)) is not type(value)
    ]
    assert not wrong, wrong
