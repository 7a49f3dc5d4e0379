"""Model shapes and the KV bytes each token costs, per SGLang's pool sizing.

Numbers come from the models' published configs (see README, "Presets"). The formulas follow
SGLang's `profile_max_num_token` / `_compute_cell_size`:

* MLA (DeepSeek-V3, Kimi-K2.x): ``(kv_lora_rank + qk_rope_head_dim) * layers * bytes``, the same on
  every tensor-parallel rank because the latent is replicated.
* MHA/GQA: ``kv_heads_per_rank * (head_dim + v_head_dim) * layers * bytes`` with
  ``kv_heads_per_rank = max(1, kv_heads // attention_tp)``.
"""

from __future__ import annotations

from dataclasses import dataclass

# Bytes per element of the KV cache for each `--kv-cache-dtype` value the twin accepts.
KV_DTYPE_BYTES: dict[str, float] = {
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "mxfp8": 1 + 1 / 32,
    "fp4_e2m1": 0.5 + 1 / 16,
    "nvfp4": 0.5 + 1 / 16,
    "fp4_mx_block16": 0.5 + 1 / 16,
}


@dataclass(frozen=True)
class ModelSpec:
    """The parts of a Hugging Face config that decide memory and speed."""

    name: str  # the Hugging Face repository id, used as --model-path by default
    architecture: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    dtype: str  # the dtype `auto` resolves to for the KV cache
    weight_bytes: int  # bytes of the whole checkpoint as loaded
    kv_lora_rank: int = 0  # > 0 means multi-head latent attention (MLA)
    qk_rope_head_dim: int = 0
    num_experts: int = 0  # routed experts per MoE layer (0 = dense)
    experts_per_token: int = 0
    expert_weight_bytes: int = 0  # the routed experts' share of weight_bytes
    multimodal: bool = False

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def kv_heads_per_rank(self, attention_tp: int) -> int:
        return max(1, self.num_kv_heads // max(1, attention_tp))

    def cell_size(self, kv_dtype: str, attention_tp: int = 1) -> int:
        """KV bytes per token on one GPU for a resolved KV dtype (never `auto`)."""
        elem = KV_DTYPE_BYTES[kv_dtype]
        if self.is_mla:
            return int((self.kv_lora_rank + self.qk_rope_head_dim) * self.num_layers * elem)
        heads = self.kv_heads_per_rank(attention_tp)
        return int(heads * self.head_dim * 2 * self.num_layers * elem)

    def resolve_kv_dtype(self, requested: str) -> str:
        """`auto` means the model's own dtype (none of our presets ships FP8 KV scales)."""
        return self.dtype if requested == "auto" else requested


# Kimi-K2.5's text backbone is DeepSeek-V3-shaped (61 layers, MLA 512 + 64, 384 experts, top-8).
# Its checkpoint is ~554 GiB: INT4 routed experts (~570 GB with scales) plus ~24 GB in BF16.
KIMI_K2_5 = ModelSpec(
    name="moonshotai/Kimi-K2.5",
    architecture="KimiK25ForConditionalGeneration",
    model_type="kimi_k25",
    num_layers=61,
    hidden_size=7168,
    num_attention_heads=64,
    num_kv_heads=64,
    head_dim=192,
    vocab_size=163840,
    context_length=262144,
    dtype="bf16",
    weight_bytes=595_000_000_000,
    kv_lora_rank=512,
    qk_rope_head_dim=64,
    num_experts=384,
    experts_per_token=8,
    expert_weight_bytes=570_000_000_000,
    multimodal=True,
)

LLAMA_3_1_8B = ModelSpec(
    name="meta-llama/Llama-3.1-8B-Instruct",
    architecture="LlamaForCausalLM",
    model_type="llama",
    num_layers=32,
    hidden_size=4096,
    num_attention_heads=32,
    num_kv_heads=8,
    head_dim=128,
    vocab_size=128256,
    context_length=131072,
    dtype="bf16",
    weight_bytes=16_060_522_496,
)

QWEN3_32B = ModelSpec(
    name="Qwen/Qwen3-32B",
    architecture="Qwen3ForCausalLM",
    model_type="qwen3",
    num_layers=64,
    hidden_size=5120,
    num_attention_heads=64,
    num_kv_heads=8,
    head_dim=128,
    vocab_size=151936,
    context_length=40960,
    dtype="bf16",
    weight_bytes=65_535_000_000,
)

MODELS: dict[str, ModelSpec] = {m.name: m for m in (KIMI_K2_5, LLAMA_3_1_8B, QWEN3_32B)}
