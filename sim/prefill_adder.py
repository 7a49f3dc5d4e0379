"""Forming a prefill batch: SGLang's `PrefillAdder`, which admits waiting requests while the
KV pool, `max_prefill_tokens` and the chunk size leave room for them.

The engine runs the batch formed here; this module only decides what goes in it and allocates
the memory for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sim.memory import CLIP_MAX_NEW_TOKENS
from sim.radix import Match, Tokens
from sim.request import Request

if TYPE_CHECKING:
    from sim.engine import Engine


@dataclass
class PrefillBatch:
    """A prefill batch being formed: its requests and the budgets left to fill."""

    rem_total: int  # tokens the pool can still give, net of running requests' reserve
    rem_input: int  # max_prefill_tokens left
    chunk_budget: int | None  # chunked_prefill_size left (None: chunking off)
    items: list[tuple[Request, int]] = field(default_factory=list)  # (request, tokens computed)
    new_tokens: int = 0
    cached: int = 0
    loaded: int = 0
    readmitted: int = 0

    def take(self, req: Request, extend: int, reserve: int) -> None:
        self.items.append((req, extend))
        self.new_tokens += extend
        self.rem_input -= extend
        self.rem_total -= extend + reserve
        if self.chunk_budget is not None:
            self.chunk_budget -= extend


def form_prefill_batch(engine: Engine, running_bs: int) -> PrefillBatch | None:
    """The next prefill batch, or None when the chunked request in progress cannot continue
    (nothing left to evict: the engine decodes until memory frees up)."""
    batch = _new_prefill_batch(engine)
    # A request in the middle of a chunked prefill always goes first.
    if engine.chunked is not None and not _continue_chunked(engine, batch):
        return None
    _add_waiting(engine, batch, running_bs)
    return batch


def _new_prefill_batch(engine: Engine) -> PrefillBatch:
    """The budgets of PrefillAdder: free plus evictable tokens, less what running requests
    are expected to still need (`new_token_ratio` of their remaining output)."""
    rem_total = engine.free + engine.tree.evictable_tokens - engine.cfg.page_size
    ratio = engine.new_token_ratio
    full = engine.cfg.fixed_length_full_reserve
    rem_total -= int(
        sum(
            min(r.remaining, CLIP_MAX_NEW_TOKENS) * (1.0 if full and r.stop_at is None else ratio)
            for r in engine.running
        )
    )
    chunk = engine.cfg.chunked_prefill_size
    return PrefillBatch(
        rem_total=rem_total,
        rem_input=engine.cfg.max_prefill_tokens,
        chunk_budget=chunk if chunk > 0 else None,
    )


def _continue_chunked(engine: Engine, batch: PrefillBatch) -> bool:
    """Add the next chunk of the request in the middle of a chunked prefill, if it fits."""
    cont = engine.chunked
    assert cont is not None
    extend = len(cont.fill_ids()) - cont.prefilled
    if batch.chunk_budget is not None:
        extend = min(extend, batch.chunk_budget)
    if not engine.alloc(extend):
        return False
    cont.private += extend
    engine.private_total += extend
    batch.take(cont, extend, reserve=0)
    if cont.prefilled + extend >= len(cont.fill_ids()):
        engine.chunked = None
    return True


def _add_waiting(engine: Engine, batch: PrefillBatch, running_bs: int) -> None:
    """Admit waiting requests in order until one does not fit (SGLang's `add_one_req`)."""
    page = engine.cfg.page_size
    while engine.waiting and engine.chunked is None:
        if len(batch.items) + running_bs >= engine.cfg.max_running_requests:
            engine.batch_is_full = True
            return
        req = engine.waiting[0]
        fill = req.fill_ids()
        match = _match(engine, fill)
        prefix = match.device_len + match.host_len
        extend = len(fill) - prefix
        reserve = min(req.remaining, CLIP_MAX_NEW_TOKENS)
        if extend + reserve >= batch.rem_total:
            engine.batch_is_full = True
            return
        if extend >= batch.rem_input and batch.items:
            return
        is_chunked = batch.chunk_budget is not None and extend > batch.chunk_budget
        if is_chunked:
            extend = (batch.chunk_budget or 0) // page * page
            if extend <= 0:
                return
        if not _admit(engine, req, match, extend):
            engine.batch_is_full = True
            return
        engine.waiting.popleft()
        batch.readmitted += 1 if req.retractions else 0
        batch.take(req, extend, reserve=0 if is_chunked else reserve)
        batch.cached += prefix
        batch.loaded += match.host_len
        if is_chunked:
            engine.chunked = req


def _match(engine: Engine, fill: Tokens) -> Match:
    if not engine.radix:
        return Match(0, 0, engine.tree.root, engine.tree.root)
    # The last token is always computed (SGLang never serves a whole prompt from cache).
    return engine.tree.match_prefix(fill[:-1], engine.now)


def _admit(engine: Engine, req: Request, match: Match, extend: int) -> bool:
    """Lock the prefix, allocate room for host hits and new tokens, load host hits back."""
    engine.tree.lock(match.last_node)  # protects device and host parts while we allocate
    if not engine.alloc(extend + match.host_len):
        engine.tree.unlock(match.last_node)
        return False
    if match.host_len:
        # The loaded tokens leave "free" and become device tokens of the tree.
        engine.free += match.host_len
        before = engine.tree.device_tokens
        engine.tree.load_back(match, engine.now)
        engine.free -= engine.tree.device_tokens - before
    prefix = match.device_len + match.host_len
    if engine.radix:
        req.node = match.last_node
        req.tree_len = prefix
    req.private += extend
    engine.private_total += extend
    req.prefilled = prefix
    if req.admitted_at is None:
        req.admitted_at = engine.now
        req.cached_tokens = prefix
        req.cached_device = match.device_len
        req.cached_host = match.host_len
    return True
