"""A request as one scheduler sees it, and the deterministic stand-ins for a model's output.

The twin samples no model: output tokens and where a prompt's answer would end are pure
functions of the request, so that a run can be replayed exactly.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from sim.radix import Node, Tokens


@dataclass(eq=False)
class Request:
    rid: str
    input_ids: Tokens
    max_new_tokens: int
    arrival: float
    stream: bool = False
    stop_at: int | None = None  # where the model emits EOS (None: runs to max_new_tokens)
    on_progress: Callable[[Request], None] | None = None
    on_finish: Callable[[Request], None] | None = None
    # --- scheduler state ---
    out_len: int = 0
    output_ids: list[int] = field(default_factory=list)  # filled when the request finishes
    prefilled: int = 0  # tokens of (input + output) whose KV is computed
    node: Node | None = None  # locked radix node (prefix this request holds)
    tree_len: int = 0  # tokens of this request held by the tree (locked path length)
    private: int = 0  # KV tokens allocated outside the tree
    # --- accounting for meta_info and metrics ---
    cached_tokens: int = 0
    cached_device: int = 0
    cached_host: int = 0
    admitted_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: str = ""
    retractions: int = 0
    priority: int | None = None  # labels the queue gauges; the twin schedules first come first
    # an OpenAI-compatible request with temperature 0: answered as a function of its prompt
    # (`greedy_output`) rather than of its id
    greedy: bool = False
    aborted: bool = False
    last_progress_out: int = 0
    last_progress_at: float = 0.0

    @property
    def seq_len(self) -> int:
        return len(self.input_ids) + self.out_len

    @property
    def target(self) -> int:
        """Output length at which the request finishes."""
        return (
            self.max_new_tokens if self.stop_at is None else min(self.stop_at, self.max_new_tokens)
        )

    @property
    def remaining(self) -> int:
        return max(0, self.max_new_tokens - self.out_len)

    def fill_ids(self) -> Tokens:
        """Input plus the output so far: what a (re-)prefill must cover."""
        if self.out_len == 0:
            return self.input_ids
        return self.input_ids + tuple(synthetic_output(self.rid, self.out_len))


# The synthetic output's vocabulary; its tokens repeat with this period (7919 is odd).
SYNTHETIC_PERIOD = 1024


def synthetic_output(
    rid: str, n: int, vocab: int = SYNTHETIC_PERIOD, offset: int = 1000
) -> list[int]:
    """Deterministic output token ids for a request (the twin does not sample from a model)."""
    base = _stable_hash(rid)
    return [offset + (base + i * 7919) % vocab for i in range(n)]


def synthetic_token(rid: str, i: int, vocab: int = SYNTHETIC_PERIOD, offset: int = 1000) -> int:
    """`synthetic_output(rid, i + 1)[i]` without building the list."""
    return offset + (_stable_hash(rid) + i * 7919) % vocab


def synthetic_slice(
    rid: str, start: int, stop: int, vocab: int = SYNTHETIC_PERIOD, offset: int = 1000
) -> tuple[int, ...]:
    """`synthetic_output(rid, stop)[start:stop]`, hashing the id once (a block's worth of output
    tokens is hashed for the prefix cache every time a block fills)."""
    base = _stable_hash(rid)
    return tuple(offset + (base + i * 7919) % vocab for i in range(start, stop))


def greedy_output(input_ids: Tokens, n: int, *, drifted: bool = False) -> list[int]:
    """The answer to a greedy request (temperature 0): a pure function of the prompt, so a
    server asked the same prompt twice answers the same way, as a real model does.

    `drifted`: the answer of a server whose numerics moved for this prompt (an 8-bit KV cache
    rounds differently): the same first half, then other tokens, as greedy decoding diverges
    once one token's choice flips."""
    key = "greedy:" + ",".join(map(str, input_ids))
    out = synthetic_output(key, n)
    if not drifted:
        return out
    kept = n // 2
    return out[:kept] + synthetic_output(key + ":drift", n - kept)


def answer_drifts(input_ids: Tokens, share: float) -> bool:
    """Whether this prompt is one of the `share` of prompts whose greedy answer drifts
    (deterministic per prompt, so every ask of it agrees)."""
    digest = hashlib.sha256(",".join(map(str, input_ids)).encode()).digest()
    return int.from_bytes(digest[:8], "big") % 10_000 < share * 10_000


def natural_answer_length(input_ids: Tokens, seed: int, mean_tokens: int) -> int:
    """Where the simulated model would stop on its own (EOS), deterministic per prompt.

    Gamma-distributed with shape 16 (a coefficient of variation of 25%) around `mean_tokens`.
    """
    rng = random.Random(hash((input_ids[:64], len(input_ids), seed)))
    return max(1, int(rng.gammavariate(16.0, mean_tokens / 16.0)))


def _stable_hash(text: str) -> int:
    h = 2166136261
    for ch in text.encode():
        h = ((h ^ ch) * 16777619) & 0xFFFFFFFF
    return h
