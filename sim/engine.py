"""The scheduler core: one SGLang scheduler (one DP rank) in simulated time.

It reproduces the parts of SGLang's `Scheduler` that decide throughput under memory pressure:

* prefill-first: a prefill batch runs whenever one can be formed, else one decode step;
* admission by `PrefillAdder`: a new request needs `extend + min(max_new, 4096)` tokens against
  `available + evictable - sum(running: min(remaining, 4096) * new_token_ratio)`; after a refusal
  the batch is marked full until a request finishes or is retracted;
* `new_token_ratio` decays linearly from `0.7 * conservativeness` to 14% of that over 600 decode
  steps, resets when idle, and jumps after a retraction;
* retraction before a decode step that cannot give every request a token: fewest outputs first
  (then longest input), until 20 tokens per remaining request are free; retracted requests keep
  their outputs and are re-prefilled later;
* chunked prefill, a radix prefix cache with LRU eviction and the hierarchical host tier;
* batch latencies from the preset's step model; GPU OOM when a batch's activations exceed the
  headroom that `mem_fraction_static` left.

Nothing here sleeps: `step()` runs one batch and advances `now` by its simulated duration.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sim.memory import Headroom, activation_need_gib
from sim.observer import DecodeStats, NullObserver, Observer, PrefillStats
from sim.prefill_adder import PrefillBatch, form_prefill_batch
from sim.presets import Preset
from sim.radix import RadixTree, Tokens
from sim.request import Request, natural_answer_length, synthetic_output

RETRACT_DECODE_STEPS = 20
NEW_TOKEN_RATIO_DECAY_STEPS = 600
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14


class GpuOutOfMemory(Exception):
    """A batch needed more activation memory than the static split left free."""


class HostOutOfMemory(Exception):
    """The host pool's pinned pages were touched beyond the host's RAM: the kernel kills us."""


@dataclass
class EngineConfig:
    preset: Preset
    max_total_num_tokens: int
    cell_size: int
    max_running_requests: int
    chunked_prefill_size: int  # -1 = off
    max_prefill_tokens: int
    page_size: int
    schedule_conservativeness: float
    disable_radix_cache: bool
    host_pool_tokens: int  # 0 = no hierarchical cache
    hicache_write_policy: str
    decode_log_interval: int
    headroom: Headroom
    tp_size: int
    host_oom_on_first_batch: bool = False
    stream_interval: int = 1
    # SGLang 0.5.23: a running request with ignore_eos reserves all its remaining tokens
    # ("fixed-length requests cannot benefit from the early-EOS estimate").
    fixed_length_full_reserve: bool = False


class Engine:
    def __init__(self, cfg: EngineConfig, observer: Observer | None = None) -> None:
        self.cfg = cfg
        self.observer: Observer = observer or NullObserver()
        self.now = 0.0
        self.size = cfg.max_total_num_tokens
        self.free = cfg.max_total_num_tokens
        self.private_total = 0
        self.tree = RadixTree(cfg.host_pool_tokens, cfg.hicache_write_policy)
        self.radix = not cfg.disable_radix_cache
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.chunked: Request | None = None
        self.batch_is_full = False
        self.init_ratio = min(0.7 * cfg.schedule_conservativeness, 1.0)
        self.min_ratio = self.init_ratio * MIN_NEW_TOKEN_RATIO_FACTOR
        self.ratio_decay = (self.init_ratio - self.min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = self.init_ratio
        # counters and per-interval accumulators
        self.forward_ct_decode = 0
        self.num_generated_since_log = 0
        self.last_decode_log_at = 0.0
        self.last_gen_throughput = 0.0
        self.last_cache_hit_rate = 0.0
        self.last_retracted = 0
        self.retracted_total = 0
        self.generated_total = 0  # tokens decoded (including the first token of each prefill)
        self.prefill_computed_total = 0
        self.prefill_cached_total = 0  # prompt tokens a prefill batch found in the prefix cache
        self.decoded_total = 0  # tokens of decode steps (a prefill's first token not counted)
        self.busy_time = 0.0
        self.prefill_time = 0.0
        self.decode_time = 0.0
        self.loaded_back_total = 0
        self.batches = 0
        self.decode_moments = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        # SGLang 0.5.23 counts a decode step's moments only when the step before it was a
        # decode step too, with no idle gap between (`scheduler.py`: "Decode regression uses
        # launch cadence and skips boundaries"); the first decode after a prefill is not counted.
        self.decode_follows_decode = False
        self._touched_host = False
        self._requests: dict[str, Request] = {}
        # (simulated time, tokens) each time a batch was larger than any before: the largest
        # batch decides at which true activation peak the run would have died, and when
        # (benchmarks judge several hidden peaks from one run this way).
        self.batch_records: list[tuple[float, int]] = []

    # ----------------------------------------------------------------- public API
    def submit(self, req: Request) -> None:
        req.last_progress_at = self.now
        self.waiting.append(req)
        self._requests[req.rid] = req

    def abort(self, rid: str) -> bool:
        req = self._requests.get(rid)
        if req is None or req.finished_at is not None:
            return False
        req.aborted = True
        if req in self.waiting:
            self.waiting.remove(req)
            self._finish(req, "abort")
        return True

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running and self.chunked is None

    @property
    def evictable(self) -> int:
        return self.tree.evictable_tokens

    @property
    def used_tokens(self) -> int:
        """SGLang's num_used: max_total - (available + evictable)."""
        return self.size - self.free - self.tree.evictable_tokens

    @property
    def token_usage(self) -> float:
        return self.used_tokens / self.size

    def running_kv_tokens(self) -> int:
        return sum(r.seq_len for r in self.running)

    def step(self) -> float:
        """Run one batch (prefill if one can be formed, else decode); return its duration.

        Returns 0.0 when there is nothing to do (the caller then lets idle time pass).
        """
        duration = self._prefill()
        if duration is None:
            duration = self._decode()
        else:
            self.decode_follows_decode = False
        if duration is None:
            self.new_token_ratio = self.init_ratio
            self.decode_follows_decode = False
            return 0.0
        self.batches += 1
        return duration

    def advance_idle(self, until: float) -> None:
        self.now = max(self.now, until)

    def flush_cache(self) -> bool:
        if not self.idle:
            return False
        self.free += self.tree.device_tokens
        self.tree.reset()
        return True

    # ----------------------------------------------------------------- memory helpers
    def alloc(self, n: int) -> bool:
        if n <= 0:
            return True
        if self.free < n and self.radix:
            self.free += self.tree.evict(n - self.free)
        if self.free < n:
            return False
        self.free -= n
        return True

    def _release(self, req: Request) -> None:
        """Give back a request's private KV and its lock on the tree (finish or retract)."""
        self.free += req.private
        self.private_total -= req.private
        req.private = 0
        if req.node is not None:
            self.tree.unlock(req.node)
            req.node = None
        req.tree_len = 0

    def _cache_in_tree(self, req: Request, tokens: Tokens) -> None:
        """Insert computed KV into the tree and move the request's lock to the new node."""
        added, node = self.tree.insert(tokens, self.now)
        moved = len(tokens) - req.tree_len  # tokens that were private until now
        duplicates = moved - added
        self.free += duplicates
        self.private_total -= moved
        req.private -= moved
        self.tree.lock(node)
        if req.node is not None:
            self.tree.unlock(req.node)
        req.node = node
        req.tree_len = len(tokens)

    # ----------------------------------------------------------------- prefill
    def _prefill(self) -> float | None:
        if self.chunked is None and (self.batch_is_full or not self.waiting):
            return None
        running_bs = len(self.running)
        if running_bs >= self.cfg.max_running_requests and self.chunked is None:
            self.batch_is_full = True
            return None
        batch = form_prefill_batch(self, running_bs)
        if batch is None or not batch.items:
            return None
        return self._run_prefill(batch)

    def _run_prefill(self, batch: PrefillBatch) -> float:
        """Run the formed batch: advance the clock, cache the computed KV, start decoding the
        requests whose prefill is complete, and report the batch."""
        self._check_activation(batch.new_tokens)
        self._check_host_touch()
        st = self.cfg.preset.step
        duration = (
            st.prefill_base_s
            + batch.new_tokens / st.prefill_tokens_per_s
            + batch.loaded * self.cfg.cell_size / st.host_link_bytes_per_s
        )
        self.now += duration
        self.busy_time += duration
        self.prefill_time += duration
        self.prefill_computed_total += batch.new_tokens
        self.prefill_cached_total += batch.cached
        self.loaded_back_total += batch.loaded
        for req, extend in batch.items:
            self._prefilled(req, extend)
        self._finish_completed()
        cached, new_tokens = batch.cached, batch.new_tokens
        self.last_cache_hit_rate = cached / (cached + new_tokens) if cached + new_tokens else 0.0
        self.observer.prefill_batch(
            self,
            PrefillStats(
                new_seq=len(batch.items),
                new_tokens=new_tokens,
                cached_tokens=cached,
                host_loaded_tokens=batch.loaded,
                token_usage=self.token_usage,
                running=len(self.running),
                queued=len(self.waiting),
                pending_tokens=sum(r.seq_len for r in self.waiting),
                duration=duration,
                retracted_readmitted=batch.readmitted,
            ),
        )
        return duration

    def _prefilled(self, req: Request, extend: int) -> None:
        req.prefilled += extend
        fill = req.fill_ids()
        if self.radix:
            self._cache_in_tree(req, fill[: req.prefilled])
        if req.prefilled >= len(fill):
            # The forward pass of the last chunk samples the next token.
            if req.first_token_at is None:
                req.first_token_at = self.now
            req.out_len += 1
            self.generated_total += 1
            self.num_generated_since_log += 1
            self.running.append(req)
            self._notify(req)

    # ----------------------------------------------------------------- decode
    def _decode(self) -> float | None:
        if not self.running:
            return None
        self._retract_if_needed()
        if not self.running:
            return None
        bs = len(self.running)
        if not self.alloc(bs):  # pragma: no cover - retraction guarantees room
            raise RuntimeError("decode allocation failed after retraction")
        self.private_total += bs
        kv = 0
        for r in self.running:
            r.out_len += 1
            r.private += 1
            kv += r.seq_len
        self._check_activation(bs)
        st = self.cfg.preset.step
        duration = (
            st.decode_base_s + st.per_seq_s * bs + kv * self.cfg.cell_size / st.mem_bw_bytes_per_s
        )
        model = self.cfg.preset.model
        if model.is_moe:
            touched = 1 - (1 - model.experts_per_token / model.num_experts) ** bs
            duration += (
                self.cfg.preset.expert_bytes_per_gpu(self.cfg.tp_size)
                * touched
                / st.mem_bw_bytes_per_s
            )
        if self.tree.hierarchical:
            duration += st.hicache_decode_overhead_s
        self.now += duration
        self.busy_time += duration
        self.decode_time += duration
        self._count_decode_step(bs, duration)
        self.generated_total += bs
        self.decoded_total += bs
        self.num_generated_since_log += bs
        self.forward_ct_decode += 1
        self.new_token_ratio = max(self.new_token_ratio - self.ratio_decay, self.min_ratio)
        for r in self.running:
            if r.stream and r.out_len - r.last_progress_out >= self.cfg.stream_interval:
                self._notify(r)
        self._finish_completed()
        if self.forward_ct_decode % self.cfg.decode_log_interval == 0:
            gap = self.now - self.last_decode_log_at
            self.last_decode_log_at = self.now
            self.last_gen_throughput = self.num_generated_since_log / gap if gap > 0 else 0.0
            self.num_generated_since_log = 0
            self.observer.decode_log(
                self,
                DecodeStats(
                    running=len(self.running),
                    used_tokens=self.used_tokens,
                    token_usage=self.token_usage,
                    gen_throughput=self.last_gen_throughput,
                    queued=len(self.waiting),
                ),
            )
        return duration

    def _count_decode_step(self, bs: int, duration: float) -> None:
        """The step's moments, where SGLang counts them: after another decode step."""
        if self.decode_follows_decode:
            step_us = duration * 1e6
            moments = self.decode_moments
            moments[0] += 1.0
            moments[1] += bs
            moments[2] += step_us
            moments[3] += bs * bs
            moments[4] += bs * step_us
            moments[5] += bs
        self.decode_follows_decode = True

    def _retract_if_needed(self) -> None:
        need = len(self.running) * self.cfg.page_size
        if self.free + self.tree.evictable_tokens >= need:
            return
        old_ratio = self.new_token_ratio
        order = sorted(self.running, key=lambda r: (r.out_len, -len(r.input_ids)), reverse=True)
        retracted: list[Request] = []
        while order:
            avail = self.free + self.tree.evictable_tokens
            if retracted and avail >= len(order) * RETRACT_DECODE_STEPS:
                break
            if len(order) == 1 and avail >= self.cfg.page_size:
                break
            victim = order.pop()
            self._release(victim)
            victim.prefilled = 0
            victim.retractions += 1
            retracted.append(victim)
        if not retracted:
            return
        self.running = order
        self.waiting.extend(retracted)
        total_out = sum(r.out_len for r in order)
        total_max = sum(r.max_new_tokens for r in order)
        if total_max:
            self.new_token_ratio = min(
                1.0, (total_out + RETRACT_DECODE_STEPS * len(order)) / total_max
            )
        self.batch_is_full = False
        self.last_retracted = len(retracted)
        self.retracted_total += len(retracted)
        self.observer.retracted(self, len(retracted), old_ratio, self.new_token_ratio)

    # ----------------------------------------------------------------- finishing
    def _finish_completed(self) -> None:
        done = [r for r in self.running if r.out_len >= r.target or r.aborted]
        if not done:
            return
        keep = [r for r in self.running if not (r.out_len >= r.target or r.aborted)]
        self.running = keep
        self.batch_is_full = False
        for r in done:
            if self.radix and not r.aborted:
                self._cache_in_tree(r, r.fill_ids()[: r.seq_len - 1])
            self._release(r)
            reason = "abort" if r.aborted else "length" if r.out_len >= r.max_new_tokens else "stop"
            self._finish(r, reason)

    def _finish(self, req: Request, reason: str) -> None:
        req.finished_at = self.now
        req.finish_reason = reason
        req.output_ids = synthetic_output(req.rid, req.out_len)
        self._requests.pop(req.rid, None)
        if req.on_finish is not None:
            req.on_finish(req)

    def _notify(self, req: Request) -> None:
        req.last_progress_out = req.out_len
        req.last_progress_at = self.now
        if req.on_progress is not None:
            req.on_progress(req)

    # ----------------------------------------------------------------- failure checks
    def _check_activation(self, tokens_in_batch: int) -> None:
        records = self.batch_records
        if not records or tokens_in_batch > records[-1][1]:
            records.append((self.now, tokens_in_batch))
        hr = self.cfg.headroom
        if hr.batch_fits(self.cfg.preset, tokens_in_batch):
            return
        need = activation_need_gib(self.cfg.preset, tokens_in_batch)
        free_mib = max(0.0, hr.activation_gib) * 1024
        total = self.cfg.preset.memory.gpu_memory_mib / 1024
        raise GpuOutOfMemory(
            f"CUDA out of memory. Tried to allocate {need - max(0.0, hr.activation_gib) + 0.25:.2f}"
            f" GiB. GPU 0 has a total capacity of {total:.2f} GiB of which {free_mib:.2f} MiB is "
            f"free. Of the allocated memory {total - hr.activation_gib:.2f} GiB is allocated by "
            "PyTorch. (batch of "
            f"{tokens_in_batch} tokens)"
        )

    def _check_host_touch(self) -> None:
        if self.cfg.host_oom_on_first_batch and not self._touched_host:
            self._touched_host = True
            raise HostOutOfMemory("host pinned memory overcommitted")


def run_for(
    engine: Engine, duration: float, on_idle: Callable[[Engine], bool] | None = None
) -> None:
    """Advance an engine as fast as possible for `duration` simulated seconds.

    `on_idle` may submit work (a closed-loop workload); if it returns False the clock jumps.
    """
    end = engine.now + duration
    while engine.now < end:
        spent = engine.step()
        if spent == 0.0 and (on_idle is None or not on_idle(engine)):
            engine.advance_idle(end)


__all__ = [
    "DecodeStats",
    "Engine",
    "EngineConfig",
    "GpuOutOfMemory",
    "HostOutOfMemory",
    "NullObserver",
    "Observer",
    "PrefillStats",
    "Request",
    "natural_answer_length",
    "run_for",
    "synthetic_output",
]
