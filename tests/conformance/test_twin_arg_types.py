"""Conformance, fast: the twin declares the flags kvpilot changes as SGLang 0.5.23 does, takes
every edit kvpilot can emit with the value kvpilot meant, and refuses at parse time what SGLang's
argparse refuses (`--hicache-size 40.0` among them).

The edits and refusals are the ones tests/real_sglang/test_real_arg_parser.py puts through the
real parser (tests/arg_cases.py), which also checks SGLANG_0523 and `sglang_parses` against it.
"""

from __future__ import annotations

import argparse

import pytest

from playbooks.engines.sglang.allow_list import ALLOWED
from sim.args import KV_DTYPE_CHOICES_0523, build_parser, resolve
from tests.arg_cases import (
    SGLANG_0523,
    accepted_edits,
    refused_combinations,
    refused_values,
    sglang_parses,
)

TWIN = ["--sglang-version", "0.5.23"]


def _actions() -> dict[str, argparse.Action]:
    return {a.dest: a for a in build_parser()._actions}


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_the_twin_declares_the_flag_as_sglang(name: str) -> None:
    want = SGLANG_0523[name]
    got = _actions()[name]
    assert tuple(got.option_strings) == want.option_strings
    assert got.default == want.default
    if want.type_name is None:
        assert isinstance(got, argparse._StoreTrueAction)
        return
    assert getattr(got.type, "__name__", None) == want.type_name
    if name == "kv_cache_dtype":  # checked after parsing, against the version's list
        assert got.choices is None and tuple(KV_DTYPE_CHOICES_0523) == want.choices
    else:
        assert (tuple(got.choices) if got.choices else None) == want.choices


def test_the_twin_takes_every_edit_kvpilot_emits() -> None:
    wrong = []
    for edit in accepted_edits():
        sa = resolve([*TWIN, *edit.args]).server_args
        for name, value in edit.change.items():
            if sa[name] != value or type(sa[name]) is not type(value):
                wrong.append((edit.items, name, value, sa[name]))
    assert not wrong, "\n".join(map(str, wrong))


def test_the_twin_refuses_what_sglangs_argparse_refuses(
    capsys: pytest.CaptureFixture[str],
) -> None:
    refusals = [r for r in refused_values() if not sglang_parses(r.key, r.text)]
    assert {r.key for r in refusals} == set(ALLOWED)
    for refusal in refusals:
        with pytest.raises(SystemExit) as exc:
            resolve([*TWIN, *refusal.args])
        err = capsys.readouterr().err
        assert exc.value.code == 2, refusal
        flags = "/".join(SGLANG_0523[refusal.key].option_strings)  # argparse names every alias
        assert f"argument {flags}:" in err or "unrecognized arguments" in err, (refusal, err)
        declared = SGLANG_0523[refusal.key].type_name
        if declared in ("int", "float"):
            assert f"invalid {declared} value: '{refusal.text}'" in err, (refusal, err)


def test_the_twin_refuses_a_float_hicache_size(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        resolve([*TWIN, "--hicache-size", "40.0"])
    assert exc.value.code == 2
    assert "argument --hicache-size: invalid int value: '40.0'" in capsys.readouterr().err
    assert resolve([*TWIN, "--hicache-size", "40"]).server_args["hicache_size"] == 40


def test_the_twin_refuses_a_chunk_the_page_does_not_divide(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for refusal in refused_combinations():
        with pytest.raises(SystemExit):
            resolve([*TWIN, *refusal.args])
        assert "chunked_prefill_size must be divisible by page_size" in capsys.readouterr().err
