"""What a host tier (SGLang's hierarchical cache) buys: recomputation saved, less its costs.

A host pool does not let more requests run (the GPU pool is the same); it keeps prefixes the
GPU pool evicted, so a prefix that comes back is loaded instead of computed again. What that
buys is the prefill time spent today recomputing prefixes the larger cache would have kept.

The window says how much of the busy time is prefill (`TimeBudget.prefill_share`, from SGLang's
own step accounting) and what share of prompt tokens already hit the GPU's cache (`hit`). The
share a cache of `gpu + host` tokens would hit follows the simplest model of reuse, prefixes
coming back uniformly from a working set larger than the pool (documents asked about, chats
returning): the hit share grows with the cache's size, `hit x (gpu + host) / gpu`, up to every
prompt token. The prefill time left is the part of today's computed tokens the larger cache
would still miss, so the decode rate grows by `1 / (1 - share x saved)`. That is the interval's
high end; its low end charges the tier's own costs, up to `OVERHEAD` of the busy time: every
computed page written through to the host, and every scheduler step polling the transfers
(`DECODE_OVERHEAD` in `hicache`).

Measured on one H100 (SGLang 0.5.17, Llama-3-8B, pool 166,398 tokens, host ratio 2, 150 clients;
tests/fixtures/gpu/h100-sglang-0.5.17/ab-0.45-*):
- questions about 250,000 tokens of documents (1.5 pools): 59% of prompt tokens hit, prefill 37%
  of the busy time; with the tier 97% hit and the decode rate rose 58.3% (95% +52.1..+64.8%);
  this model: +37%..+59%;
- long prompts that never return: nothing hit; with the tier the decode rate fell 4.4% (95%
  -7.1..-0.6%): prefill time rose 15% (the write-through) and decode steps 4%; this model:
  -9%..0%.
The model cannot see reuse that comes back later than the GPU pool keeps anything (a hit share
of zero says only that nothing returned within it): it then predicts no gain, and says so.
"""

from __future__ import annotations

from playbooks.engines.kit.checks import Observed
from playbooks.engines.sglang.proposed_change import Finding
from playbooks.engines.timebudget import TimeBudget

REUSE_WORTH_A_TIER = 0.10  # share of prompt tokens already hitting the cache
PROMPT_HEAVY = 2.0  # prompt tokens per output token above which prefill is worth saving
OVERHEAD = 0.10  # the tier's cost at most, as a share of the busy time (H100: 4.4% measured)
NO_REUSE = 0.01  # a hit share below this: nothing measurable comes back


def hit_with_tier(hit: float, gpu_tokens: int, host_tokens: int) -> float:
    """The share of prompt tokens a cache of `gpu_tokens + host_tokens` would hit, reuse
    spread uniformly over more than the GPU pool holds."""
    if gpu_tokens <= 0 or hit <= 0:
        return max(0.0, hit)
    return min(1.0, hit * (gpu_tokens + max(0, host_tokens)) / gpu_tokens)


def recompute_saved(hit: float, gpu_tokens: int, host_tokens: int) -> float:
    """The share of today's computed prompt tokens the tier would serve from the host."""
    if hit >= 1:
        return 0.0
    return (hit_with_tier(hit, gpu_tokens, host_tokens) - hit) / (1 - hit)


def host_tier_gain(
    budget: TimeBudget | None, hit: float | None, gpu_tokens: int, host_tokens: int
) -> tuple[float, float] | None:
    """The decode rate's change with a host pool of `host_tokens`, as an interval (its costs
    charged in full at the low end, none at the high); None without the window's prefill share
    or hit share."""
    if budget is None or hit is None:
        return None
    share = min(1.0, max(0.0, budget.prefill_share))
    kept = share * recompute_saved(hit, gpu_tokens, host_tokens)
    high = 1 / (1 - kept) - 1 if kept < 1 else float("inf")
    low = 1 / (1 - kept + OVERHEAD) - 1
    return (low, high)


def gain_words(gain: tuple[float, float], hit: float, saved: float, share: float) -> str:
    """The prediction in a sentence, with what it rests on."""
    low, high = gain
    return (
        f"{hit:.0%} of prompt tokens hit the GPU's cache and prefill takes {share:.0%} of the busy "
        f"time; a host pool would serve about {saved:.0%} of what is recomputed now, if prefixes "
        f"return from across more than the GPU pool holds: decode rate {low:+.0%}..{high:+.0%} "
        f"(the low end charges the tier's writes to the host and per-step polling, up to "
        f"{OVERHEAD:.0%} of the time)"
    )


def tier_usefulness(seen: Observed, gpu_tokens: int, host_tokens: int) -> Finding:
    """Whether a host pool of `host_tokens` helps (`tier_advice`), with what it is predicted to
    buy where the window says."""
    found = tier_advice(seen)
    said: tuple[str, ...] = (
        "HiCache keeps evicted prefixes in host RAM; it does not add room for running "
        "requests (max_total_num_tokens stays the same)",
    )
    budget, hit = seen.m.time_budget, seen.m.cached_fraction
    gain = host_tier_gain(budget, hit, gpu_tokens, host_tokens)
    if gain is not None and budget is not None and hit and found.verdict != "not_useful":
        saved = recompute_saved(hit, gpu_tokens, host_tokens)
        said += (gain_words(gain, hit, saved, budget.prefill_share),)
    return Finding(found.verdict, said + found.reasons, found.risks)


def tier_advice(seen: Observed) -> Finding:
    """A host tier pays off where a full pool evicts long prefixes that come back."""
    """A host tier pays off where a full pool evicts long prefixes that come back."""
    m = seen.m
    if seen.bottleneck != "kv_cache":
        return Finding("not_useful", ("the KV pool is not the bottleneck, so little is evicted",))
    prompt, output = m.avg_prompt_tokens, m.avg_output_tokens
    if prompt is None or output is None or prompt < PROMPT_HEAVY * output:
        sizes = ""
        if output and prompt:
            sizes = f" ({output:,.0f} output vs {prompt:,.0f} prompt tokens)"
        return Finding(
            "not_useful",
            (
                f"requests are dominated by generation{sizes}: a reloaded prefix saves "
                "little, and HiCache adds decode cost (sglang#26305)",
            ),
        )
    reuse = m.cached_fraction
    if reuse is not None and reuse < NO_REUSE:
        return Finding(
            "not_useful",
            (
                f"no prompt token came back in the window ({reuse:.1%} hit the cache): a "
                "host tier would keep prefixes nobody asks for again and costs its writes "
                "to the host and per-step polling (an H100 lost 4.4% so); reuse that "
                "returns later than the GPU pool keeps anything cannot show here, an "
                "experiment can",
            ),
        )
    if reuse is not None and reuse >= REUSE_WORTH_A_TIER:
        if m.evicted_tokens == 0:
            return Finding(
                "not_useful",
                (
                    f"{reuse:.0%} of prompt tokens hit the cache, but nothing was evicted "
                    "from the GPU in the window (sglang:evicted_tokens_total): what comes "
                    "back is still there, so a host tier would keep nothing more and adds "
                    "decode cost",
                ),
            )
        evicted = (
            f" ({m.evicted_tokens:,} tokens evicted in the window)" if m.evicted_tokens else ""
        )
        return Finding(
            "recommended",
            (
                f"prompts are long ({prompt:,.0f} tokens) and "
                f"{reuse:.0%} of prompt tokens already hit the cache while the pool is "
                f"full: prefixes come back and are being evicted{evicted}, so a host tier "
                "should serve them instead of recomputing",
            ),
            ("pinned host memory",),
        )
    return Finding(
        "possible",
        (
            "prompts are long but little is reused now: this helps only if requests share "
            "prefixes (multi-turn chat, agents, shared documents)",
        ),
    )
