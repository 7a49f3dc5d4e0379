"""Hardware + model presets for the twin.

Each preset fixes what SGLang would measure on a real box (free GPU memory before and after the
weights load, the GPU's nvidia-smi total that drives SGLang's defaults, host RAM) and the
constants of the step-time model. Sources are listed per preset; the incident preset is calibrated
so that `--mem-fraction-static 0.85` gives exactly the 116,171 tokens the incident's log printed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.models import (
    GPT_OSS_120B,
    KIMI_K2_5,
    LLAMA_3_1_8B,
    LLAMA_3_1_8B_FP8,
    QWEN3_32B,
    ModelSpec,
)

GIB = 1 << 30


@dataclass(frozen=True)
class StepModel:
    """Batch latency model (simulated seconds).

    decode  = base + routed_experts_touched(B) / bw + per_seq * B + kv_tokens * kv_bytes / bw
    prefill = prefill_base + new_tokens / prefill_tokens_per_s + loaded_host_bytes / host_link_bw

    ``routed_experts_touched(B) = expert_bytes_per_gpu * (1 - (1 - k/E) ** B)``: with top-k routing
    over E experts a batch of B tokens touches that expected fraction of the experts' weights.
    """

    decode_base_s: float
    mem_bw_bytes_per_s: float
    per_seq_s: float
    prefill_base_s: float
    prefill_tokens_per_s: float
    host_link_bytes_per_s: float
    hicache_decode_overhead_s: float = 0.0  # extra per decode step with HiCache on (MLA)


@dataclass(frozen=True)
class MemoryModel:
    """GPU memory as SGLang's profiler sees it, per GPU, in GiB (2^30 bytes)."""

    gpu_memory_mib: int  # nvidia-smi memory.total; drives SGLang's default heuristics
    free_before_load_gib: float  # torch.cuda.mem_get_info() free, before weights (SGLang's `pre`)
    weights_gib: float  # per GPU, as reported in memory_usage.weight
    other_static_gib: float  # CUDA context growth, NCCL, workspaces, replicated towers
    graph_gib: float  # CUDA graphs captured after the KV pool
    activation_base_gib: float  # activations of the smallest batch
    activation_per_ktoken_gib: float  # activation growth per 1K prefill tokens in one batch
    hicache_extra_gib: float = 0.5  # transfer buffers the hierarchical cache keeps on the GPU
    # The prefill CUDA graph's part of `graph_gib` (SGLang 0.5.17 reports graphs per phase, and
    # 0.5.16-0.5.17 skip the prefill graph with less than 4 GiB free: `sim.memory`)
    prefill_graph_gib: float = 0.0
    # The true activation peak over the modelled one (`--sim-activation-peak-scale`): real
    # servers peak higher than any model (allocator fragmentation, drivers, kernels' workspaces).
    # Twin-only and hidden from everything the server reports; only start-up ignores it.
    activation_peak_scale: float = 1.0


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    model: ModelSpec
    gpu_name: str
    tp_size: int
    gpus_per_host: int
    host_ram_gib: float
    host_other_gib: float  # RSS and unreclaimable page cache besides the KV host pool
    startup_s: float  # weight loading and warm-up, simulated seconds
    answer_tokens: int  # mean length of an answer that ends at EOS (no ignore_eos)
    memory: MemoryModel
    step: StepModel
    sources: tuple[str, ...] = field(default_factory=tuple)
    # Flags the deployment is launched with, put before the command line's own (which win).
    launch_args: tuple[str, ...] = ()

    def expert_bytes_per_gpu(self, tp_size: int) -> float:
        return self.model.expert_weight_bytes / max(1, tp_size)

    def dense_bytes_per_gpu(self, tp_size: int) -> float:
        return (self.model.weight_bytes - self.model.expert_weight_bytes) / max(1, tp_size)


KIMI_INCIDENT = Preset(
    name="kimi-k2.5-rtxpro6000-tp8",
    description="Kimi-K2.5 (INT4 experts, MLA) at TP8 on 8x RTX PRO 6000 Blackwell, PCIe only",
    model=KIMI_K2_5,
    gpu_name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
    tp_size=8,
    gpus_per_host=8,
    host_ram_gib=256.0,
    host_other_gib=40.0,
    startup_s=480.0,
    answer_tokens=3500,
    memory=MemoryModel(
        gpu_memory_mib=97_887,
        free_before_load_gib=95.3,
        weights_gib=69.25,
        # Calibrated: 0.85 * 95.3 - 69.25 - 4.15205 = 7.60295 GiB = 116,171 tokens of 70,272 B.
        other_static_gib=4.15205,
        graph_gib=2.0,
        activation_base_gib=1.0,
        activation_per_ktoken_gib=0.49,
    ),
    step=StepModel(
        decode_base_s=0.012,
        mem_bw_bytes_per_s=1.2e12,
        per_seq_s=0.0,
        prefill_base_s=0.030,
        prefill_tokens_per_s=6_000.0,
        host_link_bytes_per_s=30e9,
        hicache_decode_overhead_s=0.005,
    ),
    sources=(
        "incident log: 116,171 tokens at 0.85, ~159K at 0.88, ~50 running, 780-890 tok/s",
        "nvidia-smi total 97,887 MiB (sglang #18870); 1.79 TB/s GDDR7, PCIe Gen5, no NVLink",
        "Kimi-K2.5 config: 61 layers, kv_lora_rank 512, qk_rope 64, 384 experts top-8",
        "decode model and OOM heuristic: reference physics §4-§5; HiCache TPOT cost sglang #26305",
    ),
)

LLAMA_H100 = Preset(
    name="llama-3.1-8b-h100",
    description="Llama-3.1-8B-Instruct (BF16, GQA 8 KV heads) on one H100 SXM 80GB",
    model=LLAMA_3_1_8B,
    gpu_name="NVIDIA H100 80GB HBM3",
    tp_size=1,
    gpus_per_host=8,
    host_ram_gib=1024.0,
    host_other_gib=24.0,
    startup_s=45.0,
    answer_tokens=400,
    memory=MemoryModel(
        gpu_memory_mib=81_559,
        free_before_load_gib=78.57,
        weights_gib=15.02,
        other_static_gib=0.07,
        graph_gib=1.928,
        activation_base_gib=0.5,
        activation_per_ktoken_gib=0.12,
        prefill_graph_gib=1.473,
    ),
    step=StepModel(
        decode_base_s=0.0065,
        mem_bw_bytes_per_s=2.35e12,
        per_seq_s=0.000005,
        prefill_base_s=0.005,
        prefill_tokens_per_s=25_000.0,
        host_link_bytes_per_s=45e9,
    ),
    sources=(
        "config: 32 layers, 8 KV heads, head_dim 128 -> 131,072 B/token in BF16",
        "H100 SXM 80GB: nvidia-smi 81,559 MiB, 3.35 TB/s HBM3 (70% effective)",
        "the real SGLang 0.5.17 on an H100 (tests/sim/test_preset_gpu.py): weights 15.02 GiB, "
        "CUDA graphs 1.473 GiB prefill + 0.455 decode, capacity 6,436.6 tokens per 0.01 of the "
        "fraction (free before load 78.57 by that slope; the log said 78.50), start-up 37-54 s",
        "decode steps on that GPU: ~13.5 ms at 57 requests (~120K KV tokens), ~24 ms at 150 "
        "(~315K): 6.5 ms + 0.056 us per KV token; the batch itself adds next to nothing (an "
        "H200 stepped 14-15 ms at any batch from 77 to 127 with its pool full)",
    ),
)

QWEN_H200 = Preset(
    name="qwen3-32b-h200-tp2",
    description="Qwen3-32B (BF16, GQA 8 KV heads) at TP2 on 2x H200 141GB",
    model=QWEN3_32B,
    gpu_name="NVIDIA H200",
    tp_size=2,
    gpus_per_host=8,
    host_ram_gib=2048.0,
    host_other_gib=32.0,
    startup_s=90.0,
    answer_tokens=600,
    memory=MemoryModel(
        gpu_memory_mib=143_771,
        free_before_load_gib=139.8,
        weights_gib=30.52,
        other_static_gib=1.2,
        graph_gib=0.8,
        activation_base_gib=0.6,
        activation_per_ktoken_gib=0.15,
    ),
    step=StepModel(
        decode_base_s=0.0115,
        mem_bw_bytes_per_s=3.36e12,
        per_seq_s=0.00008,
        prefill_base_s=0.008,
        prefill_tokens_per_s=14_000.0,
        host_link_bytes_per_s=50e9,
    ),
    sources=(
        "config: 64 layers, 8 KV heads, head_dim 128 -> 262,144 B/token in BF16 (131,072 per rank)",
        "H200: nvidia-smi 143,771 MiB total, 143,156 MiB free on an idle GPU (recorded fixture)",
        "4.8 TB/s HBM3e (70% effective), NVLink",
    ),
)


KIMI_H200_DPATTN = Preset(
    name="kimi-k2.5-h200-tp8-dpattn",
    description="Kimi-K2.5 (INT4 experts, MLA) at TP8 with DP attention 8 on 8x H200 141GB",
    model=KIMI_K2_5,
    gpu_name="NVIDIA H200",
    tp_size=8,
    gpus_per_host=8,
    host_ram_gib=2048.0,
    host_other_gib=64.0,
    startup_s=420.0,
    answer_tokens=3500,
    memory=MemoryModel(
        gpu_memory_mib=143_771,
        free_before_load_gib=139.8,
        weights_gib=69.25,
        other_static_gib=4.6,  # NCCL and the DP-attention gather buffers on top of the incident's
        graph_gib=3.0,
        activation_base_gib=1.0,
        activation_per_ktoken_gib=0.49,
    ),
    step=StepModel(
        decode_base_s=0.010,
        mem_bw_bytes_per_s=3.36e12,
        per_seq_s=0.00002,
        prefill_base_s=0.025,
        prefill_tokens_per_s=9_000.0,
        host_link_bytes_per_s=50e9,
        hicache_decode_overhead_s=0.004,
    ),
    sources=(
        "weights per GPU as the incident preset (same checkpoint at TP8)",
        "H200: nvidia-smi 143,771 MiB total (recorded fixture); 4.8 TB/s HBM3e, NVLink",
        "DP attention: one scheduler and KV pool per attention-DP rank, MLA latent replicated",
    ),
    launch_args=("--enable-dp-attention", "--dp-size", "8"),
)

GPT_OSS_H100 = Preset(
    name="gpt-oss-120b-h100",
    description="gpt-oss-120b (MXFP4 experts, hybrid SWA 18 + 18 layers) on one H100 SXM 80GB",
    model=GPT_OSS_120B,
    gpu_name="NVIDIA H100 80GB HBM3",
    tp_size=1,
    gpus_per_host=8,
    host_ram_gib=1024.0,
    host_other_gib=24.0,
    startup_s=120.0,
    answer_tokens=800,
    memory=MemoryModel(
        gpu_memory_mib=81_559,
        free_before_load_gib=79.1,
        weights_gib=60.77,
        other_static_gib=1.0,
        graph_gib=0.6,
        activation_base_gib=0.5,
        activation_per_ktoken_gib=0.10,
    ),
    step=StepModel(
        decode_base_s=0.008,
        mem_bw_bytes_per_s=2.35e12,
        per_seq_s=0.00004,
        prefill_base_s=0.006,
        prefill_tokens_per_s=20_000.0,
        host_link_bytes_per_s=45e9,
    ),
    sources=(
        "config: 36 layers (18 sliding_attention window 128, 18 full), 8 KV heads, head_dim 64",
        "KV: 2,048 B per token per layer in BF16 -> full 36,864 B + SWA 36,864 B x ratio 0.8",
        "weights 65.25 GB (MXFP4 experts), 60.77 GiB per GPU",
    ),
)

LLAMA_FP8_H100 = Preset(
    name="llama-3.1-8b-fp8kv-h100",
    description="Llama-3.1-8B-Instruct-FP8 (checkpoint with FP8 KV scales) on one H100 SXM 80GB",
    model=LLAMA_3_1_8B_FP8,
    gpu_name="NVIDIA H100 80GB HBM3",
    tp_size=1,
    gpus_per_host=8,
    host_ram_gib=1024.0,
    host_other_gib=24.0,
    startup_s=40.0,
    answer_tokens=400,
    memory=MemoryModel(
        gpu_memory_mib=81_559,
        free_before_load_gib=79.1,
        weights_gib=8.46,
        other_static_gib=1.0,
        graph_gib=0.6,
        activation_base_gib=0.5,
        activation_per_ktoken_gib=0.12,
    ),
    step=StepModel(
        decode_base_s=0.0060,
        mem_bw_bytes_per_s=2.35e12,
        per_seq_s=0.00005,
        prefill_base_s=0.004,
        prefill_tokens_per_s=35_000.0,
        host_link_bytes_per_s=45e9,
    ),
    sources=(
        "hf_quant_config.json: quant_algo FP8, kv_cache_quant_algo FP8 -> auto KV is fp8_e4m3",
        "KV: 32 layers x 8 heads x 128 x 2 x 1 B = 65,536 B per token",
        "weights 9.08 GB: 6.98B FP8 linear parameters + BF16 embedding and LM head",
    ),
)

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (KIMI_INCIDENT, LLAMA_H100, QWEN_H200, KIMI_H200_DPATTN, GPT_OSS_H100, LLAMA_FP8_H100)
}
DEFAULT_PRESET = KIMI_INCIDENT.name


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise ValueError(f"unknown preset {name!r}; choose one of: {known}") from None
