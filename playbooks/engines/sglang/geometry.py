"""A model's KV geometry from its Hugging Face config, the way SGLang 0.5.23 sizes a KV cell.

SGLang's cell (bytes per token per GPU, `model_executor/pool_configurator.py` and
`mem_cache/kv_cache_configurator.py::calculate_mla_kv_cache_dim`):

    MHA/GQA: max(1, kv_heads // attn_tp) * (head_dim + v_head_dim) * full_layers * elem
    MLA:     (kv_lora_rank + qk_rope_head_dim) * layers * elem     (the latent is not split by TP)
    DSA:     MLA + (index_head_dim + index_head_dim // 128 * 4) * layers   (the indexer keys, fp8)

So the server's own report (KV GiB / tokens) divided by the element count gives the element size
the pool really uses: an `auto` dtype on an FP8 checkpoint (`quantization_config.
kv_cache_quant_algo == "FP8"`, `mem_cache/kv_cache_dtype.py::configure_kv_cache_dtype`) shows
up as 1 byte although the server's arguments still say `auto`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from playbooks.engines.hf_config import (
    LAYERS,
    first_int,
    head_dim,
    kv_heads,
    language_model,
)

Kind = Literal["mha", "mla", "dsa"]
DSA_QUANT_BLOCK = 128  # the indexer's fp8 keys carry one 4-byte scale per 128 elements
FP8_NAMES = ("FP8",)
# The names Hugging Face configs give the routed experts per MoE layer (DeepSeek and Kimi,
# Qwen-MoE, Mixtral and gpt-oss, ERNIE)
ROUTED_EXPERTS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")


@dataclass(frozen=True)
class Geometry:
    kind: Kind
    layers: int  # layers holding full-attention KV
    kv_heads: int = 0
    head_dim: int = 0
    v_head_dim: int = 0
    latent_dim: int = 0  # MLA: kv_lora_rank + qk_rope_head_dim
    index_head_dim: int = 0  # DSA only
    sliding_layers: int = 0  # hybrid SWA: layers with a sliding window (their own pool)
    linear_layers: int = 0  # hybrid mamba / linear attention: state, not KV
    kv_quant_fp8: bool = False  # the checkpoint asks for FP8 KV under `auto`
    # Routed experts per MoE layer (0: a dense model). A decode step of a dense model reads all
    # its weights whatever the batch; an MoE step reads the experts its batch routes to, more
    # of them as the batch grows, so its weights are not a fixed cost (`timebudget.Traffic`).
    routed_experts: int = 0
    # A vision-language model's image encoder as SGLang sizes its headroom: (layers, hidden) read
    # as `getattr(vision_config, "num_hidden_layers", 24)` and `"hidden_size", 1024`
    # (`arg_groups/memory_hook.py::adjust_mem_fraction_for_vlm`); None for a text model.
    vision: tuple[int, int] | None = None

    @property
    def mla(self) -> bool:
        return self.kind in ("mla", "dsa")

    @property
    def hybrid(self) -> bool:
        return bool(self.sliding_layers or self.linear_layers)

    def describe(self) -> str:
        if self.mla:
            shape = f"{self.kind.upper()}, latent {self.latent_dim} x {self.layers} layers"
        else:
            shape = f"{self.kv_heads} KV heads x {self.head_dim} x {self.layers} attention layers"
        extras = [
            *([f"{self.sliding_layers} sliding-window layers"] if self.sliding_layers else []),
            *([f"{self.linear_layers} mamba/linear layers"] if self.linear_layers else []),
            *(["FP8 KV under auto"] if self.kv_quant_fp8 else []),
        ]
        return shape + "".join(f", {e}" for e in extras)

    def elements_per_token(self, attn_tp: int = 1) -> float:
        """KV elements one token takes on one GPU (what `elem` multiplies)."""
        if self.mla:
            return float(self.latent_dim * self.layers)
        heads = max(1, self.kv_heads // max(1, attn_tp))
        return float(heads * (self.head_dim + self.v_head_dim) * self.layers)

    def cell_bytes(self, elem_bytes: float, attn_tp: int = 1) -> float:
        return self.elements_per_token(attn_tp) * elem_bytes + self.indexer_bytes

    @property
    def indexer_bytes(self) -> int:
        """A DSA model's indexer keys per token over its layers (FP8 keys and one FP32 scale
        per 128, `mem_cache/pool_host/dsa.py::dsa_indexer_bytes_per_token_per_layer`); 0
        otherwise. The same bytes on the GPU and in a HiCache host pool."""
        if self.kind != "dsa":
            return 0
        return (self.index_head_dim + self.index_head_dim // DSA_QUANT_BLOCK * 4) * self.layers

    def pool_elem_bytes(self, bytes_per_token: float, attn_tp: int = 1) -> float:
        """The element size a pool of `bytes_per_token` really uses (inverts `cell_bytes`)."""
        fixed = self.cell_bytes(0.0, attn_tp)
        return (bytes_per_token - fixed) / self.elements_per_token(attn_tp)

    def fp8_gain(self, elem_bytes: float = 2.0, attn_tp: int = 1) -> float:
        """How many times the tokens grow from `elem_bytes` to 1-byte elements."""
        return self.cell_bytes(elem_bytes, attn_tp) / self.cell_bytes(1.0, attn_tp)


def _layer_counts(config: Mapping[str, Any], layers: int) -> tuple[int, int, int]:
    """(full, sliding, linear) layer counts: `layer_types` where the config has it."""
    pattern_list = config.get("hybrid_layer_pattern")  # MiMo-V2: 1 = SWA, 0 = full
    if isinstance(pattern_list, list) and pattern_list:
        sliding = sum(1 for x in pattern_list if x == 1)
        return len(pattern_list) - sliding, sliding, 0
    override = config.get("hybrid_override_pattern")  # Nemotron-H: M mamba, * attention, - MLP
    if isinstance(override, str) and override:
        return override.count("*"), 0, override.count("M")
    types = config.get("layer_types")
    if isinstance(types, list) and types:
        sliding = sum(1 for t in types if "sliding" in str(t))
        linear = sum(1 for t in types if "linear" in str(t) or "mamba" in str(t))
        return len(types) - sliding - linear, sliding, linear
    if str(config.get("model_type", "")).startswith(("gemma2", "gemma3")):
        # SGLang turns the hybrid SWA pool off for Gemma-2/3 (model_overrides/gemma2_gemma3.py):
        # every layer keeps full-length KV in the one pool
        return layers, 0, 0
    pattern = first_int(config, "sliding_window_pattern")
    if pattern and pattern > 1 and config.get("sliding_window"):  # every Nth layer is full
        full = layers // pattern
        return full, layers - full, 0
    interval = first_int(config, "full_attention_interval")
    if interval and interval > 1:  # Qwen3-Next: every Nth layer is full attention
        full = layers // interval
        return full, 0, layers - full
    return layers, 0, 0


def _kv_quant_fp8(config: Mapping[str, Any]) -> bool:
    quant = config.get("quantization_config")
    if not isinstance(quant, Mapping):
        return False
    algo = quant.get("kv_cache_quant_algo")
    if isinstance(algo, str):
        return algo.upper() in FP8_NAMES
    # compressed-tensors: SGLang takes FP8 KV only for a float, per-tensor, symmetric, static
    # scheme (quantization/compressed_tensors.py)
    scheme = quant.get("kv_cache_scheme")
    return (
        isinstance(scheme, Mapping)
        and scheme.get("num_bits") == 8
        and scheme.get("type", "float") == "float"
        and scheme.get("strategy", "tensor") == "tensor"
        and scheme.get("symmetric", True) is True
        and not scheme.get("dynamic", False)
    )


def vision_tower(config: Mapping[str, Any]) -> tuple[int, int] | None:
    """(layers, hidden) of the image encoder SGLang's memory hook reads, None without one.
    Qwen2.5-VL names its depth `depth`, which SGLang does not read: the default 24 counts."""
    vision = config.get("vision_config")
    if not isinstance(vision, Mapping):
        return None
    layers, hidden = vision.get("num_hidden_layers", 24), vision.get("hidden_size", 1024)
    if not (isinstance(layers, int) and isinstance(hidden, int)):
        return None
    return layers, hidden


def geometry_of(config: Mapping[str, Any]) -> Geometry | None:
    """The geometry, or None for a config kvpilot cannot read (it then says it does not know)."""
    vision = vision_tower(config)
    config = language_model(config)
    layers = first_int(config, *LAYERS)
    if not layers:
        return None
    fp8 = _kv_quant_fp8(config)
    experts = first_int(config, *ROUTED_EXPERTS) or 0
    lora, rope = first_int(config, "kv_lora_rank"), first_int(config, "qk_rope_head_dim")
    if lora and rope is not None:
        index = first_int(config, "index_head_dim") or 0
        kind: Kind = "dsa" if index else "mla"
        return Geometry(
            kind, layers, latent_dim=lora + rope, index_head_dim=index, kv_quant_fp8=fp8,
            routed_experts=experts, vision=vision,
        )  # fmt: skip
    heads = kv_heads(config)
    dim = head_dim(config)
    if not heads or not dim:
        return None
    full, sliding, linear = _layer_counts(config, layers)
    if full <= 0:
        return None  # no full-attention layer kvpilot can size a cell from
    v_dim = first_int(config, "v_head_dim") or dim
    return Geometry(
        "mha",
        full,
        heads,
        dim,
        v_dim,
        sliding_layers=sliding,
        linear_layers=linear,
        kv_quant_fp8=fp8,
        routed_experts=experts,
        vision=vision,
    )
