"""vLLM's rules: what a bottleneck looks like on a vLLM server, and which changes help.

Pure functions over typed facts, in modules of their own:

facts.py        the facts the rules read (`Server` before a measurement, `Context` with one)
bottleneck.py   `analyse()`: the bottleneck with numbers, an ordered table of rules
proposed_change.py       one check per launch argument: a safety half, a usefulness half
verdicts.py     `evaluate()` one change with a measurement, `judge_change()` without
proposals.py    `propose()`: the changes for a bottleneck, an ordered table of rules

The skeleton they fill in (the bottleneck table's walk, a check's halves, the verdicts, `assess`
and `judge`) is shared: `playbooks.engines.kit`. This module gathers the facts (the GPU's
memory, the model's KV page, the capacity model, host RAM) and is the entry point: `rules_for()`
and `bottleneck_of()`. `--consider KEY=VALUE` runs exactly the same checks as the bot's own
proposals.
"""

from __future__ import annotations

from playbooks.engines.disaggregation import not_judged
from playbooks.engines.kit import rules as kit
from playbooks.engines.types import Bottleneck, DiagnoseSettings, Measurement
from playbooks.engines.vllm.allow_list import FP8_DTYPES
from playbooks.engines.vllm.bottleneck import analyse
from playbooks.engines.vllm.capacity import CapacityModel, GpuMemory, block_bytes_of
from playbooks.engines.vllm.client import VLLMSettings
from playbooks.engines.vllm.facts import Context, Server, requests_fitting
from playbooks.engines.vllm.geometry import Geometry, geometry_of, with_draft
from playbooks.engines.vllm.proposals import propose
from playbooks.engines.vllm.verdicts import evaluate, judge_change
from playbooks.sources.gpu import GpuUnavailable

DEFAULT_UTILIZATION = 0.92  # config/cache.py:102, when the server does not say
# kvpilot's own host offload is a KV connector too (config/vllm.py sets it for
# --kv-offloading-size); every other connector moves KV between instances
OWN_CONNECTORS = frozenset({"OffloadingConnector"})
ROLE_WORDS = {"kv_producer": "prefill", "kv_consumer": "decode"}
PD_NEEDS = (
    "the requests waiting for KV from other instances (vllm:num_requests_waiting_by_reason) "
    "and the other role's load, which kvpilot does not read"
)


def transfer_connector(info: VLLMSettings) -> str | None:
    """The connector of an instance that moves KV between instances, if it is one."""
    connector = info.arg("kv_connector")
    if not connector or str(connector) in OWN_CONNECTORS:
        return None
    return str(connector)


def resolve_gpu_memory(settings: DiagnoseSettings) -> tuple[GpuMemory | None, list[str]]:
    """One GPU's total memory: configured, else NVML on the GPU host; None (and a note) else.
    vLLM's utilization is a share of the total, so the total is what kvpilot needs."""
    notes: list[str] = []
    if settings.gpu_memory_gib is not None:
        source = "configuration (gpu_memory_gib, as the GPU's total memory)"
        return GpuMemory(settings.gpu_memory_gib, source), notes
    if settings.gpus is not None:
        try:
            gpus = settings.gpus.snapshot()
            total = min(g.memory_total_gib for g in gpus)
            return GpuMemory(total, f"NVML: {gpus[0].name}, total", tuple(gpus)), notes
        except GpuUnavailable as exc:
            notes.append(f"GPU probe unavailable ({exc})")
    notes.append(
        "the GPU's memory is not known (no gpu_memory_gib, no NVML): capacity after a new "
        "gpu_memory_utilization cannot be put in tokens. Set gpu_memory_gib for predictions."
    )
    return None, notes


def model_geometry(
    info: VLLMSettings, settings: DiagnoseSettings, notes: list[str] | None = None
) -> Geometry | None:
    """The KV geometry from the model's config.json, a speculative drafter's layers added."""
    if settings.models is None:
        return None
    config = settings.models.read(info.model)
    geometry = geometry_of(config) if config is not None else None
    method = info.arg("speculative_method")
    if geometry is None or config is None or not method:
        return geometry
    draft_path = info.arg("speculative_model")
    draft = settings.models.read(str(draft_path)) if draft_path else None
    geometry, note = with_draft(geometry, str(method), config, draft)
    if note and notes is not None:
        notes.append(note)
    return geometry


def effective_kv_dtype(info: VLLMSettings, geometry: Geometry | None) -> str:
    """The dtype the pool uses: `auto` on a checkpoint with an FP8 KV scheme is FP8."""
    named = str(info.arg("kv_cache_dtype", "auto"))
    if named == "auto" and geometry is not None and geometry.kv_quant_fp8:
        return "fp8"
    return named


def capacity_model(
    info: VLLMSettings,
    gpu: GpuMemory | None,
    geometry: Geometry | None = None,
    utilization: float | None = None,
) -> CapacityModel:
    """The capacity arithmetic fed from the server's own report."""
    dtype = effective_kv_dtype(info, geometry)
    block_size = int(info.arg("block_size", 16))
    blocks = info.blocks_per_engine
    flag = info.arg("kv_cache_memory_bytes")
    flag = int(flag) if isinstance(flag, (int, float)) else None
    length = info.arg("max_model_len")
    override = info.arg("num_gpu_blocks_override")
    override = int(override) if isinstance(override, int) else None
    return CapacityModel(
        utilization=utilization or info.utilization or DEFAULT_UTILIZATION,
        engines=info.engines,
        blocks=blocks,
        block_size=block_size,
        tokens=info.capacity_tokens,
        kv_dtype=dtype,
        block_bytes=block_bytes_of(
            geometry, block_size, dtype, info.tp_size, blocks, flag, override is not None
        ),
        kv_bytes_flag=flag,
        gpu=gpu,
        geometry=geometry,
        max_model_len=int(length) if isinstance(length, int) else None,
        blocks_override=override,
    )


PARTS = kit.Parts(analyse, propose, evaluate, judge_change, requests_fitting)


class ServerRules(kit.ServerRules[VLLMSettings, CapacityModel, Context, Server]):
    """vLLM's rules for one server, its capacity model and host read before anything is
    measured (the skeleton: `playbooks.engines.kit.rules`)."""

    parts = PARTS

    @property
    def server(self) -> Server:
        return Server(self.info, self.cap, self.host)

    def context(self, m: Measurement) -> Context:
        return Context(self.info, m, self.cap, self.host)

    def capacity(self) -> kit.Capacity:
        gpu = self.cap.gpu
        return kit.Capacity(
            self.cap.bytes_per_token,
            gpu.total_gib if gpu is not None else 0.0,
            gpu.source if gpu is not None else "unknown",
        )

    def apart(self, ctx: Context) -> tuple[list[str], str] | None:
        """An instance that moves KV to or from others: why nothing is proposed."""
        connector = transfer_connector(self.info)
        if connector is None:
            return None
        role = str(self.info.arg("kv_role") or "kv_both")
        why = not_judged(
            ROLE_WORDS.get(role, "prefill or decode"),
            f"vLLM --kv-transfer-config {connector}, {role}",
            PD_NEEDS,
        )
        return [], why


def rules_for(
    info: VLLMSettings, settings: DiagnoseSettings, *, measured: bool = True
) -> ServerRules:
    """`measured=False` (judging a change alone) works without a known capacity, where a
    diagnosis refuses: without vLLM's metrics nothing says how large the KV cache is."""
    if measured and not info.capacity_tokens:
        raise ValueError(
            "the server reports no KV cache configuration (vllm:cache_config_info): is it "
            "running with --disable-log-stats?"
        )
    gpu, notes = resolve_gpu_memory(settings)
    host = kit.host_memory(settings, notes)
    geometry = model_geometry(info, settings, notes)
    if geometry is not None:
        notes.append(f"KV geometry from the model's config.json: {geometry.describe()}")
    cap = capacity_model(info, gpu, geometry)
    if info.arg("kv_cache_dtype") == "auto" and cap.kv_dtype in FP8_DTYPES:
        notes.append("the checkpoint declares an FP8 KV scheme, so `auto` runs FP8")
    notes += [f"settings read from: {', '.join(info.sources)}"] if info.sources else []
    notes += list(info.notes)
    return ServerRules(info, cap, host, settings, notes)


def bottleneck_of(info: VLLMSettings, m: Measurement) -> tuple[Bottleneck, list[str]] | str:
    """The bottleneck over stored measurements (no GPU or host probes), or why not."""
    if not info.capacity_tokens:
        return "the server reported no KV cache configuration; the day is not diagnosed"
    cap = capacity_model(info, None)
    return analyse(Context(info, m, cap, None))
