"""The campaign policy, table by table: which option next, when to stop, what a crash teaches."""

from __future__ import annotations

from typing import Any

import pytest

from playbooks.campaigns.cutdown import expected_gain, fitted
from playbooks.campaigns.policy import (
    Allowance,
    Bound,
    PolicyError,
    Range,
    Tried,
    bound_from,
    campaign_stop,
    choose_next,
)
from playbooks.campaigns.room import GIB, GpuRoom, room_of
from playbooks.engines.exits import Failure
from playbooks.engines.types import Option, Verdict
from playbooks.sources.gpu import FakeGpuReader, GpuState


def opt(
    change: dict[str, Any], verdict: Verdict, gain: tuple[float, float] | None = (0.1, 0.3)
) -> Option:
    title = " ".join(f"{k}={v}" for k, v in change.items()) or "raise client concurrency"
    return Option(title, change, verdict, None, gain, "", [])


SAFE = opt({"mem_fraction_static": 0.89}, "recommended", (0.25, 0.5))
EDGE = opt({"mem_fraction_static": 0.92}, "possible", (0.4, 0.8))
UNSAFE = opt({"mem_fraction_static": 0.93}, "unsafe", (0.5, 0.9))
FP8 = opt({"kv_cache_dtype": "fp8_e4m3"}, "needs_opt_in", (0.6, 1.0))
USELESS = opt({"hicache_size": 16}, "not_useful", None)
CLIENTS = opt({}, "recommended", None)
SMALL = opt({"chunked_prefill_size": 4096}, "recommended", (0.02, 0.06))
KEPT = Tried({"mem_fraction_static": 0.89}, kept=True, cause="improved")
FRACTIONS = Allowance({"mem_fraction_static": Range(0.8, 0.95)}, 3)

CHOICES = [
    # (case, options, tried, bounds, allowance, force, expected title or None)
    ("the larger expected gain first", [SMALL, SAFE], [], [], None, False, SAFE.title),
    (
        "equal gain: the lower risk",
        [opt({"a": 1}, "possible"), opt({"b": 2}, "recommended")],
        [KEPT],
        [],
        None,
        False,
        "b=2",
    ),
    ("the edge waits for a kept step", [EDGE, SAFE], [], [], None, False, SAFE.title),
    ("after a kept step the edge may go", [EDGE], [KEPT], [], None, False, EDGE.title),
    ("within the margins before the edge", [EDGE, SMALL], [KEPT], [], None, False, SMALL.title),
    ("force takes the edge at once", [EDGE], [], [], None, True, EDGE.title),
    ("force still ranks the edge last", [EDGE, SAFE], [], [], None, True, SAFE.title),
    ("unsafe never without force", [UNSAFE, SAFE], [], [], None, False, SAFE.title),
    ("unsafe with force", [UNSAFE, SAFE], [], [], None, True, UNSAFE.title),
    ("lossy needs a plan naming it", [FP8, SMALL], [], [], None, False, SMALL.title),
    ("lossy outside the plan's keys", [FP8, SAFE], [], [], FRACTIONS, False, SAFE.title),
    (
        "lossy inside the plan",
        [FP8, SAFE],
        [],
        [],
        Allowance({"kv_cache_dtype": Range(values=frozenset({"fp8_e4m3"}))}, 2),
        False,
        FP8.title,
    ),
    (
        "outside the plan's range",
        [SAFE],
        [],
        [],
        Allowance({"mem_fraction_static": Range(0.8, 0.88)}, 2),
        False,
        None,
    ),
    (
        "already tried, not kept",
        [SAFE, SMALL],
        [Tried(SAFE.change, kept=False)],
        [],
        None,
        False,
        SMALL.title,
    ),
    (
        "a learned bound forbids",
        [SAFE, SMALL],
        [],
        [Bound("mem_fraction_static", 0.89, True, "died")],
        None,
        False,
        SMALL.title,
    ),
    (
        "force passes a learned bound",
        [SAFE],
        [],
        [Bound("mem_fraction_static", 0.89, True, "died")],
        None,
        True,
        SAFE.title,
    ),
    (
        "a bound on the other side allows",
        [SAFE],
        [],
        [Bound("mem_fraction_static", 0.80, False, "too small")],
        None,
        False,
        SAFE.title,
    ),
    ("actions off the server and useless changes", [CLIENTS, USELESS], [], [], None, False, None),
    ("nothing at all", [], [], [], None, False, None),
]


@pytest.mark.parametrize(
    ("options", "tried", "bounds", "allowance", "force", "expected"),
    [c[1:] for c in CHOICES],
    ids=[c[0] for c in CHOICES],
)
def test_choose_next(
    options: list[Option],
    tried: list[Tried],
    bounds: list[Bound],
    allowance: Allowance | None,
    force: bool,
    expected: str | None,
) -> None:
    choice = choose_next(options, tried=tried, bounds=bounds, allowance=allowance, force=force)
    assert (choice.option.title if choice.option else None) == expected
    if expected is None:
        assert choice.stop
    passed = {title for title, _ in choice.skipped}
    assert expected not in passed and passed <= {o.title for o in options}


def test_a_passed_over_option_says_why() -> None:
    choice = choose_next([EDGE, UNSAFE, FP8], tried=[], bounds=[])
    reasons = dict(choice.skipped)
    assert "kept step" in reasons[EDGE.title]
    assert "unsafe" in reasons[UNSAFE.title]
    assert "--allow" in reasons[FP8.title]
    assert choice.option is None and choice.stop == "every option was passed over"


def runs_already(*values: float) -> Any:
    """A server running these fractions: a step to one of them changes nothing."""

    def why(change: Any) -> str | None:
        value = change.get("mem_fraction_static")
        if value in values:
            return f"nothing would change on `kimi`: mem_fraction_static is already {value}"
        return None

    return why


@pytest.mark.parametrize(
    ("options", "runs", "expected"),
    [
        ([SAFE, SMALL], (0.89,), SMALL.title),  # the best step is what runs: the next one
        ([SAFE], (0.89,), None),
        ([SAFE, SMALL], (0.85,), SAFE.title),
    ],
)
def test_a_step_that_changes_nothing_is_passed_over(
    options: list[Option], runs: tuple[float, ...], expected: str | None
) -> None:
    choice = choose_next(options, unchanged=runs_already(*runs))
    assert (choice.option.title if choice.option else None) == expected
    reasons = dict(choice.skipped)
    if SAFE.change["mem_fraction_static"] in runs:
        assert reasons[SAFE.title].startswith("nothing would change on `kimi`")


def test_a_cut_down_step_that_changes_nothing_is_not_taken() -> None:
    """The fraction a step is cut down to for room (0.91 here, as below) may be what runs."""
    rules = linear_rules(0.89, 0.95, 0.02)
    edge = Option("mem_fraction_static=0.92", {"mem_fraction_static": 0.92}, "possible", None,
                  (0.06, 0.12), "", [], False, 2.85)  # fmt: skip
    room = GpuRoom(3.7, "NVML")
    taken = choose_next([edge], tried=[KEPT], room=room, reassess=rules)
    assert taken.option is not None and taken.option.change == {"mem_fraction_static": 0.91}
    choice = choose_next([edge], tried=[KEPT], room=room, reassess=rules,
                         unchanged=runs_already(0.91))  # fmt: skip
    assert choice.option is None and choice.stop == "every option was passed over"


STOPS = [
    ("fresh", [], Allowance(max_experiments=2), None),
    ("restarts used", [KEPT, KEPT], Allowance(max_experiments=2), "restart(s) are used"),
    ("first not kept", [Tried({"a": 1}, kept=False)], Allowance(max_experiments=3), "not kept"),
    (
        "not kept, but the plan goes on",
        [Tried({"a": 1}, kept=False)],
        Allowance(max_experiments=3, stop_at_first_not_kept=False),
        None,
    ),
]


@pytest.mark.parametrize(
    ("tried", "allowance", "words"), [c[1:] for c in STOPS], ids=[c[0] for c in STOPS]
)
def test_campaign_stop(tried: list[Tried], allowance: Allowance, words: str | None) -> None:
    stop = campaign_stop(tried, allowance)
    assert (stop is None) if words is None else (stop is not None and words in stop)


OOM, REFUSED_FOR_MEMORY = Failure.out_of_memory, Failure.memory_refused
BOUNDS = [
    (
        "a raised fraction ran out of memory under load",
        {"mem_fraction_static": 0.93},
        {"mem_fraction_static": "0.85"},
        "died",
        OOM,
        [("mem_fraction_static", 0.93, True)],
    ),
    ("from the default", {"hicache_size": 40}, {}, "failed_start", REFUSED_FOR_MEMORY,
     [("hicache_size", 40, True)]),
    (
        "a lowered value refused for memory",
        {"chunked_prefill_size": 512},
        {"chunked_prefill_size": "8192"},
        "failed_start",
        REFUSED_FOR_MEMORY,
        [("chunked_prefill_size", 512, False)],
    ),
    # no memory evidence: nothing learnt, the change may be proposed again
    ("still loading at the ready timeout", {"mem_fraction_static": 0.88},
     {"mem_fraction_static": "0.85"}, "failed_start", Failure.timed_out, []),
    ("its arguments refused", {"max_running_requests": 64}, {}, "failed_start",
     Failure.refused, []),
    ("another crash at start", {"mem_fraction_static": 0.88}, {}, "failed_start",
     Failure.crashed, []),
    ("died without a cause to read", {"mem_fraction_static": 0.88}, {}, "died",
     Failure.unknown, []),
    ("a crash recorded before kinds were", {"mem_fraction_static": 0.88}, {}, "died", None, []),
    ("not a crash: nothing learnt", {"mem_fraction_static": 0.9}, {}, "not_improved", None, []),
    ("a guardrail: nothing learnt", {"mem_fraction_static": 0.9}, {}, "guardrail", None, []),
    ("words are not bounds", {"kv_cache_dtype": "fp8_e4m3"}, {}, "died", OOM, []),
    (
        "a broken latency target: the cap and beyond",
        {"max_running_requests": 128},
        {"max_running_requests": "16"},
        "slo",
        None,
        [("max_running_requests", 128, True)],
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "before", "cause", "failure", "expected"),
    [c[1:] for c in BOUNDS],
    ids=[str(c[0]) for c in BOUNDS],
)
def test_bound_from(
    change: dict[str, Any],
    before: dict[str, Any],
    cause: str,
    failure: Failure | None,
    expected: list[tuple[Any, ...]],
) -> None:
    bounds = bound_from(change, before, cause, failure=failure, reason="r", experiment_id=7)
    assert [(b.key, b.limit, b.above) for b in bounds] == expected
    assert all(b.experiment_id == 7 for b in bounds)


@pytest.mark.parametrize(
    ("text", "inside", "outside"),
    [
        ("0.85..0.90", [0.85, "0.9", 0.875], [0.84, 0.91, "x", None, True]),
        ("..0.9", [0.1, 0.9], [0.91]),
        ("64..", [64, 1024], [63]),
        ("fp8_e4m3,fp8_e5m2", ["fp8_e4m3", "fp8_e5m2"], ["auto", 0.9]),
    ],
)
def test_range(text: str, inside: list[Any], outside: list[Any]) -> None:
    r = Range.parse(text)
    assert all(r.allows(v) for v in inside)
    assert not any(r.allows(v) for v in outside)
    assert Range.parse(r.text()) == r


@pytest.mark.parametrize(
    ("items", "n", "words"),
    [
        (["x"], 1, "expected KEY=RANGE"),
        (["=1..2"], 1, "expected KEY=RANGE"),
        (["a=.."], 1, "bounds nothing"),
        (["a=2..1"], 1, "low end is above"),
        (["a=1..b"], 1, "not a number"),
        (["a=,"], 1, "names no value"),
        (["a="], 1, "an empty range"),
        (["a=1..2", "a=3..4"], 1, "twice"),
        ([], 0, "at least 1"),
    ],
)
def test_bad_plans(items: list[str], n: int, words: str) -> None:
    with pytest.raises(PolicyError, match=words):
        Allowance.parse(items, n)


def test_a_plan_round_trips_and_names_what_it_allows() -> None:
    plan = Allowance.parse(["mem_fraction_static=0.85..0.92", "kv_cache_dtype=fp8_e4m3"], 2)
    assert Allowance.from_json(plan.to_json()) == plan
    assert plan.text() == (
        "at most 2 restart(s), kv_cache_dtype=fp8_e4m3 mem_fraction_static=0.85..0.92, "
        "stopping at the first change not kept"
    )
    assert plan.refusal({"mem_fraction_static": 0.9}) is None
    assert "not in the plan" in (plan.refusal({"hicache_size": 8}) or "")
    assert "outside the plan" in (plan.refusal({"mem_fraction_static": 0.93}) or "")
    bound = Bound("a", 1.0, True, "r", 3)
    assert Bound.from_json(bound.to_json()) == bound


def test_expected_gain() -> None:
    assert expected_gain(SAFE) == pytest.approx(0.375)
    assert expected_gain(USELESS) == 0.0
    assert expected_gain(opt({"a": 1}, "recommended", (float("-inf"), 0.2))) == 0.0


EDGE_2_9_GIB = Option(EDGE.title, EDGE.change, "possible", None, (0.4, 0.8), "", [], False, 2.9)


@pytest.mark.parametrize(
    ("room", "force", "taken"),
    [
        (None, False, True),  # the GPUs cannot be read: the kept step is the evidence
        (GpuRoom(6.0, "NVML"), False, True),  # 3.1 GiB left after the step: room enough
        (GpuRoom(4.0, "NVML"), False, True),  # 1.1 GiB left: just over the margin
        (GpuRoom(3.5, "NVML"), False, False),  # 0.6 GiB left: less than the margin
        (GpuRoom(3.5, "NVML"), True, True),  # force overrides the measurement
    ],
)
def test_a_step_past_the_reserve_needs_room_where_the_gpus_can_be_read(
    room: GpuRoom | None, force: bool, taken: bool
) -> None:
    choice = choose_next([EDGE_2_9_GIB], tried=[KEPT], room=room, force=force)
    assert (choice.option is not None) == taken
    if not taken:
        (reason,) = dict(choice.skipped).values()
        assert "2.9 GiB more per GPU" in reason and "3.5 GiB free under load" in reason
        assert "(NVML)" in reason and "less than the 1 GiB margin" in reason


def test_room_is_not_asked_of_a_step_within_the_reserve_or_one_adding_nothing() -> None:
    tight = GpuRoom(0.5, "NVML")
    assert choose_next([SAFE], room=tight).option == SAFE  # recommended: the reserve holds
    assert choose_next([EDGE], tried=[KEPT], room=tight).option == EDGE  # adds no GPU memory


def test_the_room_is_the_tightest_gpus_free_memory() -> None:
    states = [
        GpuState(i, "H200", f"GPU-{i}", 100 * GIB, (100 - free) * GIB, free * GIB, None, None)
        for i, free in enumerate((7, 5, 9))
    ]
    room = room_of(FakeGpuReader(states), "NVML on this host")
    assert room == GpuRoom(5.0, "NVML on this host")
    assert room_of(None, "none") is None
    assert room_of(FakeGpuReader([]), "empty") is None


def linear_rules(now: float, gib_per_hundredth: float, gain_per_hundredth: float) -> Any:
    """Rules for a server at fraction `now`: each hundredth above it adds that much GPU memory
    and predicted gain; at or below it a fraction adds nothing (as `static_gpu_gib` says)."""
    asked: list[dict[str, Any]] = []

    def reassess(changes: Any) -> list[Option]:
        out = []
        for change in changes:
            asked.append(change)
            steps = round((change["mem_fraction_static"] - now) * 100)
            added = steps * gib_per_hundredth if steps > 0 else None
            steps = max(steps, 0)
            gain = (steps * gain_per_hundredth, 2 * steps * gain_per_hundredth)
            title = f"mem_fraction_static={change['mem_fraction_static']}"
            out.append(Option(title, change, "possible", None, gain, "", [], True, added))
        return out

    reassess.asked = asked  # type: ignore[attr-defined]
    return reassess


@pytest.mark.parametrize(
    ("free_gib", "force_bound", "allowed", "fitted_to"),
    [
        # 0.92 adds 3 x 0.95 = 2.85 GiB; 3.7 free leaves 0.85, under the margin. 0.91 adds 1.9
        (3.7, None, None, 0.91),
        (2.5, None, None, 0.90),  # 0.91 would leave 0.6 GiB; 0.90 leaves 1.55
        (1.5, None, None, None),  # 0.90 would leave 0.55 GiB; 0.89 is the server's own
        (2.5, Bound("mem_fraction_static", 0.90, False, "learnt", 4), None, None),  # re-checked
        (3.7, None, Allowance({"mem_fraction_static": Range(0.8, 0.95)}, 3), 0.91),
        (0.5, None, None, None),  # nothing above the server's fraction fits
    ],
)
def test_a_step_too_large_for_the_room_is_cut_down_to_what_fits(
    free_gib: float, force_bound: Bound | None, allowed: Allowance | None, fitted_to: float | None
) -> None:
    """After 0.89 was kept, 0.92 is refused for room; the rules judge smaller fractions and the
    largest that fits (with the 1 GiB margin) and is allowed is taken instead."""
    rules = linear_rules(0.89, 0.95, 0.02)
    edge = Option("mem_fraction_static=0.92", {"mem_fraction_static": 0.92}, "possible", None,
                  (0.06, 0.12), "", [], False, 2.85)  # fmt: skip
    choice = choose_next(
        [edge, USELESS],
        tried=[KEPT],
        room=GpuRoom(free_gib, "NVML"),
        reassess=rules,
        bounds=[force_bound] if force_bound else [],
        allowance=allowed,
    )
    if fitted_to is None:
        assert choice.option is None and choice.stop == "every option was passed over"
    else:
        assert choice.option is not None
        assert choice.option.change == {"mem_fraction_static": fitted_to}
    assert [c["mem_fraction_static"] for c in rules.asked][:3] == [0.91, 0.9, 0.89]


def test_a_step_passed_over_for_another_reason_is_not_cut_down() -> None:
    rules = linear_rules(0.89, 0.95, 0.02)
    choice = choose_next([EDGE_2_9_GIB], tried=[], room=GpuRoom(3.7, "NVML"), reassess=rules)
    assert choice.option is None and rules.asked == []  # no kept step yet: not a room matter
    assert fitted([SAFE, FP8], GpuRoom(9.0, "NVML"), rules) == []  # nothing to cut down


def test_the_rules_judge_the_cut_down_steps_against_the_same_measurement() -> None:
    """`reassessor` asks SGLang's own rules (as `--consider` does): each smaller fraction comes
    back with its added GPU memory and predicted gain, and one at the server's fraction adds
    nothing."""
    from playbooks.campaigns.after import reassessor  # noqa: PLC0415
    from playbooks.engines import engine_named  # noqa: PLC0415
    from playbooks.engines.types import DiagnoseSettings  # noqa: PLC0415
    from tests.playbooks.engines.sglang.test_rules import info, measurement  # noqa: PLC0415

    again = reassessor(
        engine_named("sglang"), info(), DiagnoseSettings(gpu_memory_gib=95.3), measurement()
    )
    judged = {o.change["mem_fraction_static"]: o for o in again(
        [{"mem_fraction_static": f} for f in (0.88, 0.87, 0.85)]
    )}  # fmt: skip
    assert set(judged) == {0.88, 0.87, 0.85} and all(o.considered for o in judged.values())
    assert judged[0.88].static_gpu_gib == pytest.approx(0.03 * 95.3, abs=0.01)
    assert judged[0.87].static_gpu_gib == pytest.approx(0.02 * 95.3, abs=0.01)
    assert judged[0.85].static_gpu_gib is None
    assert expected_gain(judged[0.88]) > expected_gain(judged[0.87]) > 0
