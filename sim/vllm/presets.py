"""vLLM presets: a shared `sim.presets.Preset` (model, GPU memory, step model) plus what vLLM
decides differently (the default KV block size of the attention backend).

The memory model is read the vLLM way (`sim.vllm.memory`): `free_before_load_gib` is the free
memory at worker start, `other_static_gib` the non-torch memory (NCCL, cuBLAS workspaces,
persistent buffers), `activation_*` the peak of the profiling run of `max_num_batched_tokens`
tokens, `graph_gib` the CUDA-graph estimate subtracted from the KV budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.models import LLAMA_3_1_8B, ModelSpec
from sim.presets import LLAMA_H100, MemoryModel, Preset, StepModel

# deepseek-ai/DeepSeek-V3 config.json: 61 layers, hidden 7168, 128 heads, MLA kv_lora_rank 512 +
# qk_rope_head_dim 64, 256 routed experts top-8 (+1 shared), vocab 129280, 163840 positions
# (max_position_embeddings); FP8 checkpoint of 671B parameters, ~688 GB on disk.
DEEPSEEK_V3 = ModelSpec(
    name="deepseek-ai/DeepSeek-V3",
    architecture="DeepseekV3ForCausalLM",
    model_type="deepseek_v3",
    num_layers=61,
    hidden_size=7168,
    num_attention_heads=128,
    num_kv_heads=128,
    head_dim=192,
    vocab_size=129280,
    context_length=163840,
    dtype="bf16",
    weight_bytes=688_000_000_000,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    num_experts=256,
    experts_per_token=8,
    expert_weight_bytes=656_000_000_000,
)


@dataclass(frozen=True)
class VllmPreset:
    name: str
    base: Preset
    # DEFAULT_BLOCK_SIZE = 16 on CUDA (vllm/config/cache.py:72); MLA backends may ask for more.
    block_size: int = 16

    @property
    def model(self) -> ModelSpec:
        return self.base.model

    @property
    def description(self) -> str:
        return self.base.description


LLAMA_8B_H100 = VllmPreset(
    name="llama-3.1-8b-h100",
    # The SGLang preset's GPU, model and step model; vLLM's memory split of the same box.
    base=Preset(
        name="vllm-llama-3.1-8b-h100",
        description="Llama-3.1-8B-Instruct (BF16, GQA 8 KV heads) on one H100 SXM 80GB, vLLM",
        model=LLAMA_3_1_8B,
        gpu_name=LLAMA_H100.gpu_name,
        tp_size=1,
        gpus_per_host=8,
        host_ram_gib=LLAMA_H100.host_ram_gib,
        host_other_gib=LLAMA_H100.host_other_gib,
        startup_s=60.0,
        answer_tokens=400,
        memory=MemoryModel(
            gpu_memory_mib=81_559,  # 79.65 GiB total
            free_before_load_gib=79.1,
            weights_gib=14.99,  # "Model loading took 14.99 GiB" for 8.03B BF16 parameters
            other_static_gib=0.5,
            graph_gib=0.6,
            activation_base_gib=0.3,
            activation_per_ktoken_gib=0.12,
        ),
        step=LLAMA_H100.step,
        sources=(
            "config: 32 layers, 8 KV heads, head_dim 128 -> 131,072 B/token in BF16",
            "block 16 -> 2 MiB per block (vllm/v1/kv_cache_interface.py page_size_bytes)",
            "H100 SXM 80GB: nvidia-smi 81,559 MiB; defaults 1024 seqs / 8192 tokens",
        ),
    ),
)

DEEPSEEK_V3_H200 = VllmPreset(
    name="deepseek-v3-h200-tp8",
    base=Preset(
        name="vllm-deepseek-v3-h200-tp8",
        description="DeepSeek-V3 (FP8, MLA, 256 experts top-8) at TP8 on 8x H200 141GB, vLLM",
        model=DEEPSEEK_V3,
        gpu_name="NVIDIA H200",
        tp_size=8,
        gpus_per_host=8,
        host_ram_gib=2048.0,
        host_other_gib=64.0,
        startup_s=600.0,
        answer_tokens=1500,
        memory=MemoryModel(
            gpu_memory_mib=143_771,  # 140.4 GiB total
            free_before_load_gib=139.8,
            weights_gib=80.1,  # 688 GB / 8 ranks
            other_static_gib=3.0,  # NCCL, custom all-reduce buffers
            graph_gib=2.5,
            activation_base_gib=1.5,
            activation_per_ktoken_gib=0.35,
        ),
        step=StepModel(
            decode_base_s=0.014,
            mem_bw_bytes_per_s=3.36e12,
            per_seq_s=0.00002,
            prefill_base_s=0.025,
            prefill_tokens_per_s=9_000.0,
            host_link_bytes_per_s=50e9,
        ),
        sources=(
            "config: 61 layers, MLA 512 + 64 -> 576 x 2 B x 61 = 70,272 B/token, every rank",
            "H200: nvidia-smi 143,771 MiB; 4.8 TB/s HBM3e (70% effective), NVLink",
            "weights 688 GB FP8 over 8 ranks",
        ),
    ),
    # FlashMLA, the Hopper MLA backend, works on 64-token KV blocks [inferred].
    block_size=64,
)

VLLM_PRESETS: dict[str, VllmPreset] = {p.name: p for p in (LLAMA_8B_H100, DEEPSEEK_V3_H200)}
DEFAULT_VLLM_PRESET = LLAMA_8B_H100.name


def get_vllm_preset(name: str) -> VllmPreset:
    try:
        return VLLM_PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(VLLM_PRESETS))
        raise ValueError(f"unknown vLLM preset {name!r}; choose one of: {known}") from None
