"""vLLM's v1 scheduler (vllm/v1/core/sched/scheduler.py, `Scheduler.schedule`) in simulated time.

One step:

* one token budget, `max_num_batched_tokens`, shared by everything scheduled in the step;
* RUNNING first: each running request gets `min(tokens it lacks, budget left)` tokens (one for a
  decode, a chunk for an unfinished prefill) and the KV blocks they need; when the blocks are
  missing the newest running request is preempted (recompute: its blocks are freed, it goes to
  the FRONT of the waiting queue with nothing computed), repeatedly, until the request fits or
  preempts itself (scheduler.py:760-845, `_preempt_request` :1571-1614);
* WAITING next, only if nothing was preempted in the step (:900), while budget remains and fewer
  than `max_num_seqs` run: prefix-cache lookup over full blocks, then the rest of the prompt in a
  chunk that fits the budget; the whole uncached prompt must fit the free blocks
  (`scheduler_reserve_full_isl=True`, config/scheduler.py:190), else the loop stops (FCFS);
* blocks of `block_size` tokens from one pool with a permanent null block; full blocks are
  hashed and stay cached after their requests let go, counted as free and evicted LRU on demand
  (v1/core/block_pool.py, `FreeKVCacheBlockQueue` in kv_cache_utils.py).

The step's duration comes from the preset's step model, the one the SGLang engine uses: the
decoding requests cost a decode step (weights, per-sequence cost, their KV read, routed experts)
and the prefill tokens cost prefill time. Nothing sleeps: `step()` advances `now`.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from sim.presets import Preset
from sim.request import SYNTHETIC_PERIOD, Request, synthetic_output, synthetic_slice

# Decode steps without CUDA graphs pay the kernel launches again [twin's estimate].
EAGER_DECODE_FACTOR = 1.3


@dataclass
class SchedulerConfig:
    preset: Preset
    num_gpu_blocks: int  # including the null block
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_prefix_caching: bool
    kv_bytes_per_token: int
    tp_size: int = 1
    enforce_eager: bool = False


@dataclass
class StepStats:
    """What one step did, for the logs and metrics."""

    duration: float
    scheduled_tokens: int
    prompt_computed: int
    generated: int
    preempted: int
    # vllm:iteration_tokens_total's observation: prompt tokens of requests whose first token came
    # in this step (once per request, recomputation not counted) plus generated tokens
    # (tests/real_vllm/fixtures/metrics_after_load.txt: sum 7168 = 3072 + 4096 after 8
    # preemptions); per step when `steps` identical decode steps ran at once
    iteration_tokens: int = 0
    steps: int = 1


@dataclass
class Counters:
    """The scheduler's monotonic counters (the Prometheus counters read them)."""

    preemptions: int = 0
    prompt_tokens: int = 0
    prompt_computed: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    finished: dict[str, int] = field(default_factory=dict)


@dataclass
class _Seq:
    """The block table and hashes of one request."""

    blocks: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)  # chained hashes of its full blocks
    cached: int = 0  # leading blocks already offered to the prefix cache
    counted_prompt: bool = False
    output_cycle: tuple[int, ...] = ()  # two periods of the synthetic output (`tokens_of`)


class BlockPool:
    """Free blocks plus a prefix cache of full blocks by chained hash."""

    def __init__(self, num_blocks: int, caching: bool) -> None:
        self.num_blocks = num_blocks
        self.usable = max(0, num_blocks - 1)  # block 0 is the null block
        self.caching = caching
        self._free_ids = list(range(num_blocks - 1, 0, -1))
        self.ref: dict[int, int] = {}
        self.by_hash: dict[int, int] = {}
        self.hash_of: dict[int, int] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced, LRU first

    @property
    def num_free(self) -> int:
        return len(self._free_ids) + len(self.evictable)

    @property
    def usage(self) -> float:
        """block_pool.py:877-888: 1 - free / (num_gpu_blocks - 1)."""
        if not self.usable:
            return 0.0
        return 1.0 - self.num_free / self.usable

    def allocate(self) -> int:
        if self._free_ids:
            block = self._free_ids.pop()
        else:
            block, _ = self.evictable.popitem(last=False)
            h = self.hash_of.pop(block)
            self.by_hash.pop(h, None)
        self.ref[block] = 1
        return block

    def touch(self, block: int) -> None:
        """A cache hit: take a reference on a cached block."""
        if self.ref.get(block, 0) == 0:
            self.evictable.pop(block, None)
        self.ref[block] = self.ref.get(block, 0) + 1

    def release(self, block: int) -> None:
        self.ref[block] -= 1
        if self.ref[block] > 0:
            return
        del self.ref[block]
        if block in self.hash_of:
            self.evictable[block] = None
        else:
            self._free_ids.append(block)

    def cache(self, block: int, h: int) -> None:
        if not self.caching or block in self.hash_of:
            return
        if h in self.by_hash:
            return  # an identical block is already cached; this one stays private
        self.by_hash[h] = block
        self.hash_of[block] = h

    def lookup(self, h: int) -> int | None:
        return self.by_hash.get(h) if self.caching else None

    def reset(self) -> bool:
        if self.ref:
            return False
        for block in list(self.evictable):
            self._free_ids.append(block)
        self.evictable.clear()
        self.by_hash.clear()
        self.hash_of.clear()
        return True


def tokens_of(req: Request, seq: _Seq, start: int, stop: int) -> tuple[int, ...]:
    """Tokens `start:stop` of the request's sequence: prompt, then its synthetic output. The
    output repeats every SYNTHETIC_PERIOD tokens, so one period (twice over, for slices that
    wrap) is built once per request and blocks are sliced from it."""
    n_in = len(req.input_ids)
    if stop <= n_in:
        return req.input_ids[start:stop]
    head = req.input_ids[start:n_in] if start < n_in else ()
    a, b = max(0, start - n_in), stop - n_in
    if b - a > SYNTHETIC_PERIOD:
        return head + synthetic_slice(req.rid, a, b)
    if not seq.output_cycle:
        seq.output_cycle = synthetic_slice(req.rid, 0, 2 * SYNTHETIC_PERIOD)
    first = a % SYNTHETIC_PERIOD
    return head + seq.output_cycle[first : first + b - a]


class Scheduler:
    def __init__(
        self, cfg: SchedulerConfig, on_step: Callable[[Scheduler, StepStats], None] | None = None
    ) -> None:
        self.cfg = cfg
        self.pool = BlockPool(cfg.num_gpu_blocks, cfg.enable_prefix_caching)
        self.now = 0.0
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.seqs: dict[str, _Seq] = {}
        self.counters = Counters()
        self.on_step = on_step
        self.steps = 0
        self._quiet = False  # the last step decoded every running request and changed nothing else
        self._finished_count = 0

    # ----------------------------------------------------------------- public API
    def submit(self, req: Request) -> None:
        req.last_progress_at = self.now
        self.seqs[req.rid] = _Seq()
        self.waiting.append(req)

    def abort(self, rid: str) -> bool:
        for req in list(self.waiting) + self.running:
            if req.rid == rid and req.finished_at is None:
                req.aborted = True
                if req in self.waiting:
                    self.waiting.remove(req)
                    self._finish(req, "abort")
                return True
        return False

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def advance_idle(self, until: float) -> None:
        self.now = max(self.now, until)

    @property
    def kv_usage(self) -> float:
        return self.pool.usage

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset()

    # ----------------------------------------------------------------- one step
    def step(self, horizon: float = math.inf) -> float:
        """Schedule and run one step, then as many identical decode steps after it as end by
        `horizon` (see `_quiet_steps`); return the simulated time spent (0.0: nothing to do)."""
        duration = self._step()
        if self._quiet and self.now < horizon:
            k = self._quiet_steps(horizon)
            if k:
                duration += self._fast_forward(k)
        return duration

    def _step(self) -> float:
        budget = self.cfg.max_num_batched_tokens
        self._quiet = False
        scheduled: list[tuple[Request, int]] = []
        preempted = 0
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            need = req.seq_len - req.prefilled
            n = min(need, budget)
            if n <= 0:
                i += 1
                continue
            fits = True
            while not self._grow(req, req.prefilled + n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted += 1
                if victim is req:
                    fits = False
                    break
            if not fits:
                break
            scheduled.append((req, n))
            budget -= n
            i += 1
        decoding = len(scheduled)
        if not preempted:
            budget = self._admit(budget, scheduled)
        if not scheduled:
            return 0.0
        # Quiet: every running request decoded, nobody was preempted, admitted or finished.
        quiet = (
            not preempted
            and decoding == len(scheduled) == len(self.running)
            and all(n == 1 and r.out_len > 0 for r, n in scheduled)
        )
        finished_before = self._finished_count
        duration = self._run(scheduled, preempted)
        self._quiet = quiet and self._finished_count == finished_before
        return duration

    # ----------------------------------------------------------------- quiet stretches
    # Between two events (a finish, a preemption, an admission) a v1 scheduler step of decoding
    # requests changes nothing but lengths: the same requests each get one token, the head of
    # the waiting queue still does not fit (free blocks only shrink; the blocks it would revive
    # from the prefix cache count the same whether evicted or not), and the budget left is the
    # same. Such steps are run in one go, exactly: the blocks they take, the tokens, and their
    # durations, whose KV term grows by one token per request per step.
    MAX_STRETCH = 4096

    def _quiet_steps(self, horizon: float) -> int:
        """How many more quiet steps can run: nobody finishes, no block is missing, every one
        ends by `horizon`; 0 when streaming or aborting requests need each step."""
        running = self.running
        if any(r.stream or r.aborted for r in running):
            return 0
        k_max = min(self.MAX_STRETCH, min(r.target - r.out_len for r in running) - 1)
        if k_max <= 0:
            return 0
        bs = self.cfg.block_size
        free = self.pool.num_free
        held = [(r.prefilled, len(self.seqs[r.rid].blocks)) for r in running]

        def blocks_needed(k: int) -> int:
            return sum(max(0, -(-(p + k) // bs) - b) for p, b in held)

        span = self._stretch_span()

        def fits(k: int) -> bool:
            return blocks_needed(k) <= free and self.now + span(k) <= horizon

        lo, hi = 0, k_max  # fits(lo) holds; find the largest k that fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _stretch_span(self) -> Callable[[int], float]:
        """Seconds that k quiet steps of the running requests take: each step costs the same
        but for its KV read, which grows by one token per request per step."""
        n = len(self.running)
        base, per_kv = self._step_cost(n, n)
        kv0 = sum(r.seq_len for r in self.running)
        return lambda k: k * base + per_kv * (k * kv0 + n * k * (k - 1) / 2)

    def _fast_forward(self, k: int) -> float:
        running = self.running
        n = len(running)
        duration = self._stretch_span()(k)
        caching = self.pool.caching
        bs = self.cfg.block_size
        for req in running:
            if not self._grow(req, req.prefilled + k):  # pragma: no cover - sized above
                raise RuntimeError("a quiet stretch ran out of blocks")
            req.prefilled += k
            req.out_len += k
            seq = self.seqs[req.rid]
            if caching and req.prefilled // bs > seq.cached:
                self._cache_full_blocks(req, seq)
        self.now += duration
        self.steps += k
        self.counters.generation_tokens += n * k
        if self.on_step is not None:
            self.on_step(self, StepStats(duration, n * k, 0, n * k, 0, n, steps=k))
        return duration

    def _step_cost(self, decodes: int, tokens: int) -> tuple[float, float]:
        """A step's cost before prefill: (fixed seconds for `decodes` decoding requests and the
        experts `tokens` tokens route to, seconds per KV token the decodes read)."""
        st = self.cfg.preset.step
        model = self.cfg.preset.model
        base = st.decode_base_s * (EAGER_DECODE_FACTOR if self.cfg.enforce_eager else 1.0)
        base += st.per_seq_s * decodes
        if model.is_moe:
            touched = 1 - (1 - model.experts_per_token / model.num_experts) ** tokens
            base += (
                self.cfg.preset.expert_bytes_per_gpu(self.cfg.tp_size)
                * touched
                / st.mem_bw_bytes_per_s
            )
        return base, self.cfg.kv_bytes_per_token / st.mem_bw_bytes_per_s

    def _admit(self, budget: int, scheduled: list[tuple[Request, int]]) -> int:
        bs = self.cfg.block_size
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            req = self.waiting[0]
            seq = self.seqs[req.rid]
            total = req.seq_len
            hits: list[int] = []
            if self.pool.caching:
                # At least one token is always computed: hits stop before the last token.
                for k in range((total - 1) // bs):
                    block = self.pool.lookup(self._hash(req, seq, k))
                    if block is None:
                        break
                    hits.append(block)
            hit_tokens = len(hits) * bs
            # scheduler_reserve_full_isl: the whole uncached sequence must fit the free blocks,
            # hit blocks sitting in the evictable queue included in what they take.
            need_blocks = math.ceil(total / bs) - len(hits)
            reviving = sum(1 for b in hits if self.pool.ref.get(b, 0) == 0)
            if need_blocks + reviving > self.pool.num_free:
                break
            self.waiting.popleft()
            for b in hits:
                self.pool.touch(b)
            seq.blocks = list(hits)
            seq.cached = len(hits)
            req.prefilled = hit_tokens
            if req.admitted_at is None:
                req.admitted_at = self.now
                req.cached_tokens = hit_tokens
                self.counters.prefix_queries += total
                self.counters.prefix_hits += hit_tokens
            n = min(total - hit_tokens, budget)
            if not self._grow(req, hit_tokens + n):  # pragma: no cover - checked above
                raise RuntimeError("admission allocation failed")
            self.running.append(req)
            scheduled.append((req, n))
            budget -= n
        return budget

    def _run(self, scheduled: list[tuple[Request, int]], preempted: int) -> float:
        st = self.cfg.preset.step
        decodes = [(r, n) for r, n in scheduled if r.seq_len - r.prefilled == 1 and r.out_len > 0]
        tokens = sum(n for _, n in scheduled)
        prefill_tokens = tokens - len(decodes)
        base, per_kv = self._step_cost(len(decodes), tokens)
        duration = base + per_kv * sum(r.seq_len for r, _ in decodes)
        if prefill_tokens:
            duration += st.prefill_base_s + prefill_tokens / st.prefill_tokens_per_s
        self.now += duration
        self.steps += 1
        generated = 0
        first_prompts = 0
        caching = self.pool.caching
        bs = self.cfg.block_size
        for req, n in scheduled:
            seq = self.seqs[req.rid]
            req.prefilled += n
            if caching and req.prefilled // bs > seq.cached:
                self._cache_full_blocks(req, seq)
            if req.prefilled < req.seq_len:
                continue  # a prefill chunk; no token sampled
            if not seq.counted_prompt:
                # prompt tokens count once, not again after a preemption (scheduler.py:1074)
                seq.counted_prompt = True
                self.counters.prompt_tokens += len(req.input_ids)
                first_prompts += len(req.input_ids)
            if req.first_token_at is None:
                req.first_token_at = self.now
            req.out_len += 1
            generated += 1
            if req.stream:
                self._notify(req)
        self.counters.generation_tokens += generated
        self.counters.prompt_computed += prefill_tokens
        self._finish_completed()
        stats = StepStats(
            duration, tokens, prefill_tokens, generated, preempted, first_prompts + generated
        )
        if self.on_step is not None:
            self.on_step(self, stats)
        return duration

    # ----------------------------------------------------------------- blocks
    def _grow(self, req: Request, num_tokens: int) -> bool:
        """allocate_slots: blocks for `num_tokens` computed tokens, or False (nothing taken)."""
        seq = self.seqs[req.rid]
        need = math.ceil(num_tokens / self.cfg.block_size) - len(seq.blocks)
        if need <= 0:
            return True
        if need > self.pool.num_free:
            return False
        seq.blocks.extend(self.pool.allocate() for _ in range(need))
        return True

    def _hash(self, req: Request, seq: _Seq, k: int) -> int:
        bs = self.cfg.block_size
        while len(seq.hashes) <= k:
            j = len(seq.hashes)
            parent = seq.hashes[-1] if seq.hashes else 0
            seq.hashes.append(hash((parent, tokens_of(req, seq, j * bs, (j + 1) * bs))))
        return seq.hashes[k]

    def _cache_full_blocks(self, req: Request, seq: _Seq) -> None:
        if not self.pool.caching:
            return
        full = min(req.prefilled // self.cfg.block_size, len(seq.blocks))
        for k in range(seq.cached, full):
            self.pool.cache(seq.blocks[k], self._hash(req, seq, k))
        seq.cached = max(seq.cached, full)

    def _free(self, req: Request) -> None:
        seq = self.seqs[req.rid]
        # block_pool.free_blocks: the tail first, so the LRU queue evicts a request's end first
        for block in reversed(seq.blocks):
            self.pool.release(block)
        seq.blocks = []
        seq.cached = 0

    def _preempt(self, req: Request) -> None:
        self._free(req)
        req.prefilled = 0
        req.retractions += 1  # num_preemptions of the request
        self.counters.preemptions += 1
        self.waiting.appendleft(req)

    # ----------------------------------------------------------------- finishing
    def _finish_completed(self) -> None:
        done = [r for r in self.running if r.out_len >= r.target or r.aborted]
        if not done:
            return
        self.running = [r for r in self.running if r not in done]
        for r in done:
            self._free(r)
            reason = "abort" if r.aborted else "length" if r.out_len >= r.max_new_tokens else "stop"
            self._finish(r, reason)

    def _finish(self, req: Request, reason: str) -> None:
        self._finished_count += 1
        req.finished_at = self.now
        req.finish_reason = reason
        req.output_ids = synthetic_output(req.rid, req.out_len)
        self.seqs.pop(req.rid, None)
        self.counters.finished[reason] = self.counters.finished.get(reason, 0) + 1
        if req.on_finish is not None:
            req.on_finish(req)

    def _notify(self, req: Request) -> None:
        req.last_progress_out = req.out_len
        req.last_progress_at = self.now
        if req.on_progress is not None:
            req.on_progress(req)
