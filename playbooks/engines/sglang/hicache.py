"""The hierarchical cache's host pool: does every rank's pinned pool fit in host RAM, and does
a host tier help this workload.

SGLang sizes the pool per rank (`hicache_size` GB, or `hicache_ratio` times the GPU pool), and
every rank on the host builds its own, so the host must hold ranks x size. SGLang 0.5.23 checks
that split itself and refuses to start; older versions check each rank against the whole host,
start, pin the memory and are killed by the OOM killer under load.
"""

from __future__ import annotations

from typing import Any

from playbooks.engines.sglang.capacity import GIB, HostBudget
from playbooks.engines.sglang.checks import Change, Check, Finding
from playbooks.engines.sglang.facts import Observed

DEFAULT_RATIO = 2.0  # SGLang's hicache_ratio when neither size nor ratio is given
REUSE_WORTH_A_TIER = 0.10  # share of prompt tokens already hitting the cache
PROMPT_HEAVY = 2.0  # prompt tokens per output token above which prefill is worth saving


def host_arithmetic(ctx: Change, per_rank_gb: float, budget: HostBudget) -> str:
    ranks = ctx.server.ranks_on_host
    usable_gb = budget.per_rank_budget_gib * ranks * GIB / 1e9
    return (
        f"{ranks} ranks x {per_rank_gb:.1f} GB = {per_rank_gb * ranks:.0f} GB of pinned host RAM "
        f"(every rank builds its own pool); the host has {budget.host_total_gib:.0f} GiB, "
        f"{budget.host_available_gib:.0f} GiB available, {usable_gb:.0f} GB usable after "
        "SGLang's 10 GiB reserve and a 10% margin"
    )


class HostPoolCheck(Check):
    """enable_hierarchical_cache, hicache_size, hicache_ratio: the host pool, judged as one.

    The value judged is the pool's size per rank in GB, from the size or else the ratio.
    """

    names = ("enable_hierarchical_cache", "hicache_size", "hicache_ratio")
    predicts_gain = False  # a host tier saves recomputation; the KV capacity model cannot say

    def applies(self, change: Change) -> bool:
        return change.hicache and super().applies(change)

    def value(self, change: Change) -> float:
        size_gb = float(change.values.get("hicache_size") or 0)
        if size_gb > 0:
            return size_gb
        ratio = float(change.values.get("hicache_ratio") or DEFAULT_RATIO)
        return ratio * change.current * change.cap.bytes_per_token / 1e9

    def safety(self, ctx: Change, value: Any) -> Finding:
        per_rank_gb, server = float(value), ctx.server
        ranks = server.ranks_on_host
        if server.host is None:
            return Finding(
                "unsafe",
                (
                    f"{ranks} ranks x {per_rank_gb:.1f} GB = {per_rank_gb * ranks:.0f} GB of "
                    "pinned host RAM, and host RAM is unknown (configure host_ram_gib): "
                    "cannot be checked",
                ),
                ("host OOM",),
            )
        budget = HostBudget.of(server.host.total_gib, server.host.available_gib, ranks)
        arithmetic = host_arithmetic(ctx, per_rank_gb, budget)
        if per_rank_gb * ranks > budget.per_rank_budget_gib * ranks * GIB / 1e9:
            outcome = (
                "SGLang refuses to start (it splits the host budget per rank)"
                if server.per_rank_checked
                else "SGLang checks each rank against the whole host, so it starts, pins "
                "the memory and is killed by the host's OOM killer under load"
            )
            return Finding("unsafe", (arithmetic, outcome), ("host OOM",))
        host_tokens = int(per_rank_gb * 1e9 // ctx.cap.bytes_per_token)
        if not server.per_rank_checked and host_tokens <= ctx.current:
            return Finding(
                "unsafe",
                (
                    f"the host pool ({host_tokens:,} tokens) must be larger than the GPU pool "
                    f"({ctx.current:,}): SGLang {server.info.version} refuses to start",
                ),
            )
        return Finding(reasons=(arithmetic + ": fits",))

    def usefulness(self, ctx: Change, value: Any, seen: Observed) -> Finding:
        found = self.helps(seen)
        explained = (
            "HiCache keeps evicted prefixes in host RAM; it does not add room for running "
            "requests (max_total_num_tokens stays the same)",
        )
        return Finding(found.verdict, explained + found.reasons, found.risks)

    def helps(self, seen: Observed) -> Finding:
        """A host tier pays off where a full pool evicts long prefixes that come back."""
        m = seen.m
        if seen.bottleneck != "kv_cache":
            return Finding(
                "not_useful", ("the KV pool is not the bottleneck, so little is evicted",)
            )
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
        if reuse is not None and reuse >= REUSE_WORTH_A_TIER:
            return Finding(
                "recommended",
                (
                    f"prompts are long ({prompt:,.0f} tokens) and "
                    f"{reuse:.0%} of prompt tokens already hit the cache while the pool is "
                    "full: prefixes come back and are being evicted, so a host tier should "
                    "serve them instead of recomputing",
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
