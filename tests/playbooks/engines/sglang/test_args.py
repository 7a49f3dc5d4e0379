"""The allow-list of server arguments: each value is parsed to the type SGLang's argparse declares
and spelt so that SGLang parses it back (a float spelling of an int flag makes SGLang exit)."""

from __future__ import annotations

import re

import pytest

from playbooks.engines.base import ArgError
from playbooks.engines.sglang.allow_list import arg_value, parse_change, with_change


def test_hicache_size_is_a_whole_number_of_gb_on_the_command_line() -> None:
    change = parse_change(["hicache_size=40"])
    assert change["hicache_size"] == 40 and type(change["hicache_size"]) is int
    out = with_change(["--model-path", "m"], change)
    assert arg_value(out, "hicache_size") == "40"
    assert "40.0" not in out
    assert with_change([], change) == ["--hicache-size", "40", "--enable-hierarchical-cache"]


def test_hicache_size_with_a_fraction_is_refused() -> None:
    with pytest.raises(ArgError, match="whole number of GB"):
        parse_change(["hicache_size=40.5"])


def test_integral_spellings_become_plain_integers() -> None:
    """A stored change may carry 40.0 (JSON, arithmetic): it is still spelt as SGLang's int."""
    assert parse_change(["hicache_size=40.0"])["hicache_size"] == 40
    assert arg_value(with_change([], {"hicache_size": 48.0}), "hicache_size") == "48"
    assert arg_value(with_change([], {"max_total_tokens": 2.0e5}), "max_total_tokens") == "200000"
    with pytest.raises(ArgError, match="whole number"):
        with_change([], {"max_running_requests": 12.5})
    with pytest.raises(ArgError, match="whole number"):
        with_change([], {"page_size": True})


def test_values_are_checked_again_when_spelt() -> None:
    """with_change refuses what parse_change refuses, so no path bypasses the ranges."""
    with pytest.raises(ArgError, match="mem_fraction_static"):
        with_change([], {"mem_fraction_static": 1.5})
    with pytest.raises(ArgError, match="kv_cache_dtype"):
        with_change([], {"kv_cache_dtype": "fp9"})


@pytest.mark.parametrize(
    "item",
    [
        "mem_fraction_static=nan",
        "schedule_conservativeness=nan",
        "hicache_ratio=inf",
        "hicache_size=inf",
        "max_total_tokens=1e400",
    ],
)
def test_non_finite_numbers_are_refused(item: str) -> None:
    with pytest.raises(ArgError):
        parse_change([item])


def test_page_size_divides_the_prefill_chunk() -> None:
    """SGLang refuses a positive chunk that is not a multiple of the page size."""
    with pytest.raises(ArgError, match="multiple of page_size"):
        parse_change(["page_size=16", "chunked_prefill_size=1000"])
    with pytest.raises(ArgError, match="multiple of page_size"):
        with_change(["--page-size", "16"], {"chunked_prefill_size": 1000})
    with pytest.raises(ArgError, match="multiple of page_size"):
        with_change(["--chunked-prefill-size=1000"], {"page_size": 16})
    out = with_change(["--page-size", "16"], {"chunked_prefill_size": -1})
    assert arg_value(out, "chunked_prefill_size") == "-1"
    assert parse_change(["page_size=64", "chunked_prefill_size=4096"])["page_size"] == 64


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("page_size=3", "power of two"),
        ("page_size=4096", "at most 2048"),
        ("page_size=0", "at least 1"),
        ("chunked_prefill_size=0", "at least 1 (or -1)"),
        ("max_running_requests=abc", "expected a whole number of requests"),
        ("hicache_size=-1", "at least 0"),
        ("kv_cache_dtype=nvfp4", "must be one of"),
    ],
)
def test_refusals_say_what_is_allowed(item: str, message: str) -> None:
    with pytest.raises(ArgError, match=re.escape(message)):
        parse_change([item])
