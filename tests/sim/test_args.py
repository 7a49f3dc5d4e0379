"""Command-line handling: SGLang's flags, defaults, refusals and the twin-only flags."""

from __future__ import annotations

import pytest

from sim.args import resolve


def test_defaults_resolve_like_sglang() -> None:
    cfg = resolve([])
    sa = cfg.server_args
    assert sa["tp_size"] == 8 and sa["mem_fraction_static"] == 0.848
    assert cfg.chunked_prefill_size == 8192 and sa["cuda_graph_max_bs"] == 512
    assert cfg.kv_dtype == "bf16" and cfg.page_size == 1
    assert cfg.max_req_input_len == min(262_144 - 1, cfg.capacity.max_total_num_tokens - 1) - 5


def test_unknown_flags_are_accepted_and_kept() -> None:
    cfg = resolve(["--enable-torch-compile", "--attention-backend", "fa3", "--foo=1"])
    assert cfg.unknown_args == {
        "enable_torch_compile": True,
        "attention_backend": "fa3",
        "foo": "1",
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--mem-fraction-static", "abc"], "argument --mem-fraction-static: invalid"),
        (["--mem-fraction-static", "1.5"], "must be between 0 and 1"),
        (["--tp-size", "0"], "must be a positive integer"),
        (["--kv-cache-dtype", "fp9"], "invalid choice: 'fp9'"),
        (["--kv-cache-dtype", "nvfp4", "--sglang-version", "0.5.5"], "invalid choice: 'nvfp4'"),
        (["--hicache-write-policy", "sometimes"], "invalid choice"),
        # SGLang declares --hicache-size with type=int (GB), so a float spelling exits.
        (["--hicache-size", "40.0"], "argument --hicache-size: invalid int value: '40.0'"),
        (["--max-running-requests", "8.0"], "invalid int value: '8.0'"),
        (["--max-total-tokens", "2e4"], "argument --max-total-tokens: Invalid integer value"),
        (["--page-size", "16", "--chunked-prefill-size", "1000"], "divisible by page_size"),
        (["--sglang-version", "banana"], "invalid SGLang version"),
        (["--sglang-version", "0.4.10"], "older than the oldest dialect"),
        (["--tp-size", "16"], "does not fit"),
        (["--workload", "incident"], "needs --concurrency"),
        (["--preset", "nope"], "invalid choice: 'nope'"),
        (["stray"], "unrecognized arguments: stray"),
    ],
)
def test_malformed_values_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        resolve(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_memory_failure_is_deferred_to_startup() -> None:
    cfg = resolve(["--mem-fraction-static", "0.6"])
    assert cfg.failure is not None
    assert "Not enough memory" in cfg.failure.message


def test_version_specific_choices() -> None:
    assert resolve(["--kv-cache-dtype", "nvfp4", "--sglang-version", "0.5.23"]).kv_dtype == "nvfp4"
    assert resolve(["--sglang-version", "0.5.23"]).server_args["hicache_ratio"] is None
    assert resolve(["--sglang-version", "0.5.5"]).server_args["hicache_ratio"] == 2.0


def test_token_counts_take_sglang_suffixes() -> None:
    """--max-total-tokens and --max-prefill-tokens use SGLang's human_readable_int."""
    sa = resolve(["--max-total-tokens", "20k", "--max-prefill-tokens", "8Ki"]).server_args
    assert sa["max_total_tokens"] == 20_000 and sa["max_prefill_tokens"] == 8192
