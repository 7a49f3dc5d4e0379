"""The KV that SGLang's admission sets aside for running requests' remaining output.

SGLang admits a waiting request only if its prompt and its whole output fit in what the pool has
left once every running request's remaining output is reserved (`managers/schedule_policy.py`
`PrefillAdder.__init__` adds `_get_running_request_total_token_offset` per running request to
`memory_budget.total_offset`; `mem_cache/prefill_budget.py` `PrefillBudget.remaining_total` is
available + evictable - that offset, and `add_one_req` needs prompt + min(max_new, clip) + one
page below it). Each running request reserves `min(max_new - output so far, clip) x ratio`:

* the ratio is `new_token_ratio` (`managers/scheduler_components/new_token_ratio_tracker.py`):
  `min(0.7 x schedule_conservativeness, 1.0)` after an idle spell, decaying over 600 decode
  steps to 14% of that, and re-estimated after a retraction;
* SGLang 0.5.23 uses 1.0 instead for a fixed-length request (`ignore_eos` with `max_tokens`,
  as synthetic-data jobs send): it reserves all that is left of it. 0.5.5 and 0.5.10 apply the
  ratio to every request;
* the clip is `SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION` (4096 by default, `environ.py`).

With long fixed-length generations the pool is then full of reservations while `token_usage`
(the tokens actually held) sits near one half. kvpilot sees neither `max_tokens` nor
`ignore_eos`, so it takes a running request's answer to be as long as the completed requests'
mean, and how far it has got from the tokens held: held per running request less the mean
prompt is the output so far (half the answer where that figure is out of range, as
`facts.resident_tokens` assumes). A server measured soon after a burst is early in its answers
and reserves more than half of each.

What a request may still generate is its `max_new_tokens`, not its answer: a client that sends
no `max_tokens` gets the context less its prompt (`Scheduler.init_req_max_new_tokens`: `1 << 30`
capped by `max_req_len - input_len - 1`), and one that sends a generous limit keeps it. Such
requests reserve up to the clip each, and the next one is admitted only with its whole limit
(up to the clip) free, so answers far shorter than their limit leave a pool full of
reservations at low usage. Where the mean answer explains no refused admission, kvpilot tries
that reading too (`Basis` "max_tokens") before it suspects admission itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from playbooks.engines.types import Measurement

# What a running request is taken to reserve for: its answer's mean length, that length in full
# (0.5.23's fixed-length requests), or a max_tokens larger than its answer (absent: the context).
Basis = Literal["ratio", "fixed_length", "max_tokens"]

INIT_NEW_TOKEN_RATIO = 0.7  # environ.py SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # environ.py SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
CLIP_MAX_NEW_TOKENS = 4096  # environ.py SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
# Conservativeness past which the initial ratio is already 1.0: raising it changes nothing.
CONSERVATIVENESS_SATURATION = 1.0 / INIT_NEW_TOKEN_RATIO
FIXED_LENGTH_FULL_RESERVE = (0, 5, 23)  # `ratio = 1.0 if ignore_eos` from this version on
# Held + reserved + the next request's need above this share of the pool: admission is refused
# for lack of room. The margin is for the window's averages standing in for each request's own
# numbers: admission decides at the fullest moments, the averages include the emptier ones
# after a wave of completions. The real 0.5.23 server with 13 fixed-length requests to its pool
# (tests/real_sglang/test_real_reservation.py) averaged 0.886 of the pool over 30 s while it
# refused every admission (10.8 running, 32.8 waiting); 0.9 read that as "too conservative".
FULL_OF_RESERVATIONS = 0.85
# After a request it cannot fit, SGLang marks the batch full and tries the queue again only when
# a running request finishes (`batch_is_full`, reset as requests leave the batch), and a prefill
# batch charges each request it admits its whole prompt and limit. So the running count settles
# where a finish makes room for one waiting request but not for two: with one fewer running,
# held + reserved + two needs pass the pool. Where the next request's need is its answer, a few
# hundred tokens, the margin above covers that; where it is a limit of up to 4,096 tokens, it
# does not, and the max_tokens reading asks it as such, against `LIMIT_MARGIN` of the pool. On
# the real 0.5.23 server (200-token prompts, no max_tokens, answers of 100-300 tokens, a
# 16,000-token pool) 11.7 ran at 22% usage: 1.0 of the pool by that count (0.77 by one need),
# while 5 running at 30% (0.86) would still grow (tests/real_sglang/test_real_reservation.py).
REFUSED_AT_LIMIT = 2
LIMIT_MARGIN = 0.9
# A max_tokens reading is tried where the largest limit exceeds the mean answer by this much.
GENEROUS = 1.25


def initial_ratio(conservativeness: float) -> float:
    """The ratio after an idle spell (`NewTokenRatioTracker.from_config`)."""
    return min(INIT_NEW_TOKEN_RATIO * conservativeness, 1.0)


def floor_ratio(conservativeness: float) -> float:
    """Where the ratio settles after 600 decode steps without a retraction."""
    return min(initial_ratio(conservativeness) * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)


@dataclass(frozen=True)
class Reservation:
    """What the running requests hold and reserve, against the pool, in tokens."""

    running: float
    pool: int
    held: float  # tokens in use (token_usage x pool)
    reserved: float  # running requests' remaining output, reserved
    next_need: float  # what the next waiting request needs: prompt + output + a page
    ratio: float  # the share of remaining output reserved
    ratio_source: str  # where the ratio comes from, for the evidence
    basis: Basis = "ratio"
    answer: float = 0.0  # the completed requests' mean output, tokens
    refused_at: int = 1  # waiting requests that must not fit for admission to stop

    @property
    def fixed_length(self) -> bool:
        """Reserved in full, as 0.5.23 does for fixed-length requests."""
        return self.basis == "fixed_length"

    @property
    def full(self) -> bool:
        """Whether admission refuses waiting requests for want of room (`REFUSED_AT_LIMIT`)."""
        if self.refused_at == 1:
            return self.held + self.reserved + self.next_need >= FULL_OF_RESERVATIONS * self.pool
        # one request finished: the others' share, and the next ones' needs
        left = (self.held + self.reserved) * (self.running - 1) / self.running
        return left + self.refused_at * self.next_need >= LIMIT_MARGIN * self.pool

    @property
    def usage(self) -> float:
        return self.held / self.pool


def ratio_in_use(m: Measurement, conservativeness: float, retracting: bool) -> tuple[float, str]:
    """The ratio admission applies: exported, else where SGLang's tracker would have it."""
    if m.new_token_ratio is not None:
        return m.new_token_ratio, "sglang:new_token_ratio"
    if retracting:
        # A retraction re-estimates the ratio upwards; its initial value is the likelier bound.
        return initial_ratio(conservativeness), "assumed: the initial ratio, with retractions"
    return floor_ratio(conservativeness), "assumed: the settled ratio, without retractions"


def reservation_of(
    m: Measurement,
    pool: int,
    *,
    ratio: tuple[float, str],
    fixed_length: bool = False,
    page_size: int = 1,
    limit: int | None = None,
) -> Reservation | None:
    """The reservation of the measured running requests, None without the numbers for it.

    `limit`: the requests' max_new_tokens where it exceeds their answers (a client's generous
    max_tokens; with none, the context less the prompt), else each reserves for its answer."""
    if (
        m.token_usage is None
        or m.avg_output_tokens is None
        or m.avg_prompt_tokens is None
        or m.running <= 0
        or pool <= 0
    ):
        return None
    held = m.token_usage * pool
    so_far = held / m.running - m.avg_prompt_tokens
    if not 0 <= so_far <= m.avg_output_tokens:
        so_far = m.avg_output_tokens / 2
    allowed = m.avg_output_tokens if limit is None else max(limit, m.avg_output_tokens)
    remaining = min(allowed - so_far, CLIP_MAX_NEW_TOKENS)
    share = 1.0 if fixed_length else ratio[0]
    source = "fixed-length requests, reserved in full" if fixed_length else ratio[1]
    basis: Basis = "fixed_length" if fixed_length else "ratio" if limit is None else "max_tokens"
    return Reservation(
        running=m.running,
        pool=pool,
        held=held,
        reserved=m.running * remaining * share,
        next_need=m.avg_prompt_tokens + min(allowed, CLIP_MAX_NEW_TOKENS) + page_size,
        ratio=share,
        ratio_source=source,
        basis=basis,
        answer=m.avg_output_tokens,
        refused_at=1 if limit is None else REFUSED_AT_LIMIT,
    )


def binding_reservation(
    m: Measurement,
    pool: int,
    version: tuple[int, int, int],
    conservativeness: float,
    *,
    retracting: bool = False,
    page_size: int = 1,
    context_len: int | None = None,
) -> Reservation | None:
    """The reservation that fills the pool, if one does: by the ratio over the mean answer
    first, then (0.5.23) as fixed-length requests reserved in full, then as requests whose
    max_tokens is larger than their answers (up to the clip, or to the context where that is
    shorter). None when none explains a refused admission."""
    ratio = ratio_in_use(m, conservativeness, retracting)
    by_ratio = reservation_of(m, pool, ratio=ratio, page_size=page_size)
    if by_ratio is None or by_ratio.full:
        return by_ratio
    if version >= FIXED_LENGTH_FULL_RESERVE:
        in_full = reservation_of(m, pool, ratio=ratio, fixed_length=True, page_size=page_size)
        if in_full is not None and in_full.full:
            return in_full
    # SGLang's max_req_len: min(context_len - 1, pool - 1); unknown context: the pool binds
    longest = min(context_len or pool, pool) - 1
    limit = min(CLIP_MAX_NEW_TOKENS, max(0, int(longest - (m.avg_prompt_tokens or 0))))
    if limit < GENEROUS * (m.avg_output_tokens or 0):
        return None  # answers near the limit already: the mean answer was the reading
    generous = reservation_of(m, pool, ratio=ratio, page_size=page_size, limit=limit)
    return generous if generous is not None and generous.full else None
