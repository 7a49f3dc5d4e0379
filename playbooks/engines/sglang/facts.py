"""The typed facts SGLang's rules decide over, and the small arithmetic they share.

`Server` holds what is known before any measurement (settings, capacity model, host memory), so
the safety half of a check cannot read a measurement by mistake; `Context` adds one measurement
for the bottleneck analysis and the proposals; `Observed` (`playbooks.engines.kit.checks`) is
what the usefulness half reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from playbooks.engines.sglang.capacity import CapacityModel
from playbooks.engines.sglang.client import ServerInfo
from playbooks.engines.sglang.deployment import attn_dp_size, schedulers
from playbooks.engines.sglang.reservation import Reservation, binding_reservation
from playbooks.engines.types import Measurement
from playbooks.sources.host import HostMemory

# The first SGLang release with each host-pool behaviour, read in the released wheels.
# mem_cache/pool_host/base.py host_memory_budget_bytes: available // ranks_per_host().
PER_RANK_HOST_BUDGET = (0, 5, 19)
# mem_cache/pool_host/base.py HostKVCache.__init__ warns on a host pool no larger than the
# device pool; up to 0.5.14 mem_cache/memory_pool_host.py HostKVCache.__init__ asserted.
SMALL_HOST_POOL_WARNS = (0, 5, 15)
# mem_cache/host_memory.py _cgroup_memory_headroom bounds the budget by memory.max/high.
CGROUP_HOST_BUDGET = (0, 5, 21)
SATURATED_USAGE = 0.85  # token usage above this with a queue: the KV pool is the limit
RETRACTIONS_PER_MIN_HIGH = 1.0  # SGLang's guide: about one retraction a minute is acceptable


@dataclass(frozen=True)
class Server:
    """One server's facts before any measurement: what a safety check may read."""

    info: ServerInfo
    cap: CapacityModel
    host: HostMemory | None
    ranks_on_host: int
    version: tuple[int, int, int]

    @property
    def hicache_on(self) -> bool:
        return bool(self.info.arg("enable_hierarchical_cache"))

    @property
    def per_rank_checked(self) -> bool:
        """SGLang 0.5.19 and later split the host budget per rank; older versions do not."""
        return self.version >= PER_RANK_HOST_BUDGET

    @property
    def host_pool_may_be_smaller(self) -> bool:
        """Since 0.5.15 a host pool no larger than the GPU pool is a warning, not a refusal."""
        return self.version >= SMALL_HOST_POOL_WARNS

    @property
    def container_limit_checked(self) -> bool:
        """Since 0.5.21 SGLang bounds the host budget by the container's memory cgroup."""
        return self.version >= CGROUP_HOST_BUDGET


@dataclass(frozen=True)
class Context:
    """Everything the bottleneck analysis and the proposals need: the server and a measurement."""

    info: ServerInfo
    m: Measurement
    cap: CapacityModel
    host: HostMemory | None
    ranks_on_host: int
    version: tuple[int, int, int]

    @property
    def server(self) -> Server:
        return Server(self.info, self.cap, self.host, self.ranks_on_host, self.version)

    @property
    def hicache_on(self) -> bool:
        return self.server.hicache_on

    @property
    def per_rank_checked(self) -> bool:
        return self.server.per_rank_checked

    @property
    def host_pool_may_be_smaller(self) -> bool:
        return self.server.host_pool_may_be_smaller


def ranks_on_host(info: ServerInfo) -> int:
    tp = int(info.arg("tp_size") or 1)
    pp = int(info.arg("pp_size") or 1)
    attention_dp = info.arg("enable_dp_attention") or int(info.arg("attn_dp_size") or 1) > 1
    dp = 1 if attention_dp else int(info.arg("dp_size") or 1)
    nodes = int(info.arg("nnodes") or 1)
    return max(1, tp * pp * dp // nodes)


def pool_tokens(info: ServerInfo) -> int:
    """KV tokens over all schedulers: `max_total_num_tokens` is one scheduler's pool
    (`mem_cache/kv_cache_configurator.py`: each attention-DP rank, and each `--dp-size`
    replica, is a scheduler with its own pool)."""
    return info.max_total_num_tokens * schedulers(info)


def running_cap_total(info: ServerInfo) -> int | None:
    """The running-request cap of the whole server: SGLang reports it per scheduler, having
    divided the global `--max-running-requests` by the attention-DP size only
    (`kv_cache_configurator.py::resolve_max_num_reqs`), so each replica has the whole cap."""
    per_rank = info.effective_max_running_requests
    return None if per_rank is None else per_rank * schedulers(info)


def context_len(info: ServerInfo) -> int | None:
    """The model's context length: the user's `--context-length`, else what SGLang's
    `max_req_input_len = min(context_len - 1, pool - 1) - 5` gives away when the pool is larger."""
    value = info.arg("context_length")
    if isinstance(value, int):
        return value
    limit = info.max_req_input_len
    if limit is not None and limit + 6 < info.max_total_num_tokens:
        return limit + 6
    return None


REQUEST_POOL_MIN, REQUEST_POOL_MAX = 2048, 4096  # the request table's size bounds


def running_cap_per_rank(
    tokens_per_rank: int, user_value: int | None, ranks: int, context_len: int | None
) -> int:
    """SGLang's running-request cap per attention-DP rank for a pool of `tokens_per_rank`
    (0.5.23 `mem_cache/kv_cache_configurator.py::resolve_max_num_reqs`): the global user value
    divided by the ranks, else the request table's size, and never above half the pool. Hybrid
    mamba models are capped further by their state cache, which kvpilot reads, not predicts."""
    if user_value is not None:
        wanted = max(1, user_value // max(1, ranks))
    else:
        estimate = int(tokens_per_rank / max(1, context_len or tokens_per_rank) * 512)
        wanted = max(min(estimate, REQUEST_POOL_MAX), REQUEST_POOL_MIN)
    return min(wanted, tokens_per_rank // 2)


def resident_tokens(info: ServerInfo, m: Measurement) -> float | None:
    """KV a running request holds on average: its prompt plus half its answer so far."""
    if m.avg_prompt_tokens is not None and m.avg_output_tokens is not None:
        return m.avg_prompt_tokens + m.avg_output_tokens / 2
    if m.token_usage and m.running:
        return m.token_usage * pool_tokens(info) / m.running
    return None


def requests_fitting(info: ServerInfo, m: Measurement, tokens: int | None = None) -> float | None:
    """Requests of the observed size that fit in `tokens` (the pool now by default), 10% spare."""
    per = resident_tokens(info, m)
    if not per:
        return None
    return (tokens or pool_tokens(info)) * 0.9 / per


def retraction_rate(m: Measurement) -> float | None:
    """Retractions a minute over the window, None where the counter is not exported."""
    if m.retractions is None or m.window_s <= 0:
        return None
    return m.retractions / (m.window_s / 60)


def is_retracting(m: Measurement) -> bool:
    """Whether running requests were retracted in the window (counter or gauge)."""
    return bool((retraction_rate(m) or 0) > 0 or m.retractions_seen_in_gauge)


DP_CONSERVATIVENESS = 0.3  # parallel_hook.py::_handle_data_parallelism (0.5.5 on: server_args)


def conservativeness(info: ServerInfo) -> float:
    """The conservativeness the scheduler uses, as the server reports it (SGLang's default 1.0
    when unreported). Under attention DP SGLang has already multiplied the flag by 0.3."""
    return float(info.arg("schedule_conservativeness") or 1.0)


def conservativeness_scale(info: ServerInfo) -> float:
    """From the `--schedule-conservativeness` flag to the value the scheduler uses."""
    return DP_CONSERVATIVENESS if attn_dp_size(info) > 1 else 1.0


def reservation_binding(
    info: ServerInfo, version: tuple[int, int, int], m: Measurement
) -> Reservation | None:
    """The running requests' reservation where it fills this server's pool, else None."""
    return binding_reservation(
        m,
        pool_tokens(info),
        version,
        conservativeness(info),
        retracting=is_retracting(m),
        page_size=int(info.arg("page_size") or 1),
        context_len=context_len(info),
    )


def grammar_waiting(m: Measurement) -> bool:
    """Whether at least as many requests waited for a grammar to compile as for KV: a wait
    that admission, and any change to the KV pool, leave as it is."""
    grammar = m.grammar_queued
    return grammar is not None and grammar >= 1 and grammar >= m.queued
