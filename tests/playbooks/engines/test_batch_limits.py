"""How far the running batch grows after a change: the tightest of the clients, the KV pool and
every cap on the batch, and the sentence an option carries where a cap is the tightest."""

from __future__ import annotations

import pytest

from playbooks.engines.findings import BatchCap, BatchLimits, Finding, capped_by

SEQS_64 = BatchCap("max_num_seqs=64", 64)
BUDGET_48 = BatchCap("max_num_batched_tokens=48 (one token a step for each running request)", 48)
PER_ENGINE = BatchCap("max_num_seqs=64 on each of 2 engines", 128)
PER_RANK = BatchCap("max_running_requests=128 (16 on each of 8 attention-DP ranks)", 128)

# running, queued, tokens now, tokens after, caps, the batch's growth, the cap that binds
ROWS: list[tuple[str, BatchLimits, float, BatchCap | None]] = [
    ("no cap known: the clients bind", BatchLimits(40, 56, 100, 300), 96 / 40, None),
    ("no cap known: the pool binds", BatchLimits(40, 56, 100, 150), 1.5, None),
    ("the cap binds", BatchLimits(40, 56, 100, 300, (SEQS_64,)), 64 / 40, SEQS_64),
    ("the cap is above the clients", BatchLimits(40, 20, 100, 300, (SEQS_64,)), 1.5, None),
    ("the cap is above the pool", BatchLimits(40, 56, 100, 120, (SEQS_64,)), 1.2, None),
    ("a cap equal to the clients does not bind", BatchLimits(40, 24, 100, 300, (SEQS_64,)),
     1.6, None),
    ("the tightest of two caps binds", BatchLimits(40, 56, 100, 300, (SEQS_64, BUDGET_48)),
     48 / 40, BUDGET_48),
    ("a cap over two engines", BatchLimits(80, 112, 100, 300, (PER_ENGINE,)), 128 / 80,
     PER_ENGINE),
    ("a cap over eight ranks", BatchLimits(120, 300, 100, 150, (PER_RANK,)), 128 / 120, PER_RANK),
    # a change that lowers the cap below today's batch shrinks it
    ("a cap below today's batch", BatchLimits(40, 56, 100, 300, (BatchCap("max_num_seqs=32", 32),)),
     0.8, BatchCap("max_num_seqs=32", 32)),
    ("nothing runs", BatchLimits(0, 56, 100, 300, (SEQS_64,)), 0.0, None),
    ("no pool known", BatchLimits(40, 56, 0, 300, (SEQS_64,)), 0.0, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("limits", "growth", "binding"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS]
)
def test_the_batch_grows_to_the_tightest_limit(
    limits: BatchLimits, growth: float, binding: BatchCap | None
) -> None:
    assert limits.ratio() == pytest.approx(growth)
    assert limits.binding() == binding
    # a cap that cuts today's batch is said by its own check, not as a bound on a gain
    cut = binding is not None and binding.requests < limits.running
    assert (limits.reason() is None) == (binding is None or cut)


def test_the_sentence_names_the_cap_and_what_it_allows() -> None:
    limits = BatchLimits(49, 47, 86_208, 477_696, (SEQS_64,))
    assert limits.reason() == (
        "the gain is capped by max_num_seqs=64: at most 64 requests run at once, 1.3x today's "
        "49; raise it with the pool for more"
    )
    sentence = Finding(reasons=(limits.reason() or "",))
    assert capped_by(limits, True, "recommended") == capped_by(limits, True, "possible") == sentence
    # not KV-bound, no prediction, or unsafe: no gain, so no cap is named
    assert capped_by(limits, False, "recommended") == Finding()
    assert capped_by(None, True, "recommended") == Finding()
    assert capped_by(limits, True, "unsafe") == Finding()


def assert_cap_named(reasons: list[str], words: str | None) -> None:
    """An option names the cap that binds once, in those words; none where none binds."""
    capped = [r for r in reasons if r.startswith("the gain is capped by")]
    if words is None:
        assert not capped, reasons
    else:
        assert len(capped) == 1 and words in capped[0], reasons
