"""Model shapes and the KV bytes each token costs, per SGLang's pool sizing.

Numbers come from the models' published configs (see README, "Presets"). The formulas follow
SGLang's `profile_max_num_token` / `_compute_cell_size`:

* MLA (DeepSeek-V3, Kimi-K2.x): ``(kv_lora_rank + qk_rope_head_dim) * layers * bytes``, the same on
  every tensor-parallel rank because the latent is replicated.
* MHA/GQA: ``kv_heads_per_rank * (head_dim + v_head_dim) * layers * bytes`` with
  ``kv_heads_per_rank = max(1, kv_heads // attention_tp)``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sim.shapes import DEFAULT_SWA_FULL_TOKENS_RATIO, KvShape, draft_cell_bytes

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
    nextn_layers: int = 0  # num_nextn_predict_layers: MTP heads shipped in the checkpoint
    kv_cache_quant_algo: str | None = None  # the checkpoint's quantization config says so
    swa_layers: int = 0  # sliding-window layers among num_layers (0 = no hybrid SWA pool)
    sliding_window: int = 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def kv_heads_per_rank(self, attention_tp: int) -> int:
        return max(1, self.num_kv_heads // max(1, attention_tp))

    def layer_cell(self, kv_dtype: str, attention_tp: int, layers: int) -> int:
        """KV bytes per token of `layers` layers on one GPU, for a resolved dtype (never auto)."""
        elem = KV_DTYPE_BYTES[kv_dtype]
        if self.is_mla:
            return int((self.kv_lora_rank + self.qk_rope_head_dim) * layers * elem)
        heads = self.kv_heads_per_rank(attention_tp)
        return int(heads * self.head_dim * 2 * layers * elem)

    def hf_config(self) -> dict[str, object]:
        """The model's `config.json` as its repository publishes it, in the fields that decide
        the KV cache: a twin served from a directory holding it (`write_model_dir`) is read by
        kvpilot as a real server's model directory on the GPU host is."""
        dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(self.dtype, self.dtype)
        config: dict[str, object] = {
            "architectures": [self.architecture],
            "model_type": self.model_type,
            "num_hidden_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.context_length,
            "torch_dtype": dtype,
        }
        if self.is_mla:
            config["kv_lora_rank"] = self.kv_lora_rank
            config["qk_rope_head_dim"] = self.qk_rope_head_dim
        if self.is_moe:
            config["n_routed_experts"] = self.num_experts
            config["num_experts_per_tok"] = self.experts_per_token
        if self.swa_layers:
            full = self.num_layers - self.swa_layers
            config["sliding_window"] = self.sliding_window
            config["layer_types"] = ["sliding_attention"] * self.swa_layers + (
                ["full_attention"] * full
            )
        if self.kv_cache_quant_algo:
            config["quantization_config"] = {"kv_cache_quant_algo": self.kv_cache_quant_algo}
        return config

    def cell_size(self, kv_dtype: str, attention_tp: int = 1) -> int:
        """KV bytes per token on one GPU of the full-attention layers."""
        return self.layer_cell(kv_dtype, attention_tp, self.num_layers - self.swa_layers)

    def kv_shape(
        self,
        kv_dtype: str,
        attention_tp: int = 1,
        draft_layers: int = 0,
        swa_ratio: float = DEFAULT_SWA_FULL_TOKENS_RATIO,
    ) -> KvShape:
        """Both pools' cells, the draft's layers added to the full pool's (EAGLE family)."""
        full = self.cell_size(kv_dtype, attention_tp)
        full_layers = self.num_layers - self.swa_layers
        if draft_layers:
            full += draft_cell_bytes(full, draft_layers, full_layers)
        swa = self.layer_cell(kv_dtype, attention_tp, self.swa_layers) if self.swa_layers else 0
        return KvShape(full_cell=full, swa_cell=swa, swa_ratio=swa_ratio)

    def resolve_kv_dtype(self, requested: str) -> str:
        """`auto`: fp8_e4m3 when the checkpoint quantizes its KV cache, else the model's dtype.

        mem_cache/kv_cache_dtype.py::configure_kv_cache_dtype reads the quant config's
        `kv_cache_quant_algo` ("FP8" -> torch.float8_e4m3fn on CUDA).
        """
        if requested != "auto":
            return requested
        if (self.kv_cache_quant_algo or "").upper() == "FP8":
            return "fp8_e4m3"
        return self.dtype


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

# nvidia/Llama-3.1-8B-Instruct-FP8 (ModelOpt): the Llama-3.1-8B shape with FP8 weights and
# hf_quant_config.json `{"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}`. Weights: 6.98B
# linear parameters in FP8 plus the BF16 embedding and LM head (2 x 128256 x 4096 x 2 B).
LLAMA_3_1_8B_FP8 = ModelSpec(
    name="nvidia/Llama-3.1-8B-Instruct-FP8",
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
    weight_bytes=9_080_000_000,
    kv_cache_quant_algo="FP8",
)

# openai/gpt-oss-120b config.json: 36 layers alternating sliding_attention / full_attention
# (18 each, sliding_window 128), 64 query heads, 8 KV heads, head_dim 64, hidden 2880, vocab
# 201088, 131072 positions, 128 experts top-4 in MXFP4 (checkpoint ~65.3 GB).
GPT_OSS_120B = ModelSpec(
    name="openai/gpt-oss-120b",
    architecture="GptOssForCausalLM",
    model_type="gpt_oss",
    num_layers=36,
    hidden_size=2880,
    num_attention_heads=64,
    num_kv_heads=8,
    head_dim=64,
    vocab_size=201088,
    context_length=131072,
    dtype="bf16",
    weight_bytes=65_250_000_000,
    num_experts=128,
    experts_per_token=4,
    expert_weight_bytes=62_000_000_000,
    swa_layers=18,
    sliding_window=128,
)

MODELS: dict[str, ModelSpec] = {
    m.name: m for m in (KIMI_K2_5, LLAMA_3_1_8B, QWEN3_32B, LLAMA_3_1_8B_FP8, GPT_OSS_120B)
}


def write_model_dir(spec: ModelSpec, directory: Path) -> Path:
    """A model directory with the spec's `config.json` (no weights: the twin needs none), to
    serve a twin from as `vllm serve DIR` or `--model-path DIR` serves a real one."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(spec.hf_config(), indent=2) + "\n")
    return directory
