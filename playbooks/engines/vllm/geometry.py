"""A model's KV page from its Hugging Face config, the way vLLM's v1 engine sizes one.

The sizing functions named below live in `v1/core/kv_cache_utils.py` up to vLLM 0.32 and in
`v1/core/kv_cache_planning.py` from 0.33 (read in both wheels: the same arithmetic; the
capacity figures' `get_kv_cache_capacity` and `update_kv_cache_capacity` stay in
`kv_cache_utils.py`).

vLLM allocates KV in blocks of `block_size` tokens; one layer's page is (v1/kv_cache_interface.py,
`FullAttentionSpec.real_page_size_bytes` and `MLAAttentionSpec.real_page_size_bytes`):

    GQA/MHA: block_size * kv_heads_per_rank * (head_size + head_size_v) * dtype_bytes
    MLA:     block_size * 1 * (kv_lora_rank + qk_rope_head_dim) * dtype_bytes

plus, for a DSA model (DeepSeek-V3.2: `index_head_dim` in its config), one indexer page per layer
of `block_size * (index_head_dim + index_head_dim // 128 * 4)` bytes (FP8 keys and an FP32 scale
per 128, model_executor/models/deepseek_v2.py `DeepseekV32IndexerCache`, an `MLAAttentionSpec`
of uint8), with `kv_heads_per_rank = max(1, kv_heads // tensor_parallel_size)` (config/model.py
`get_num_kv_heads`: heads are split over TP ranks, replicated where there are fewer heads than
ranks) and `head_size_v = head_size` unless the model says otherwise; an MLA latent is not split
by TP, every rank holds it whole. A plain model's block is one page per attention layer, so a
block costs `layers * page` bytes on each GPU (`get_kv_cache_config_from_groups`:
`available_memory // bytes_per_block`).

A sliding-window hybrid (gpt-oss, Gemma 2/3: full and sliding layers of one head shape) keeps
its layers in groups of equal size that share one block pool
(`_get_kv_cache_groups_uniform_page_size`): the group size is the smaller layer count, or the
larger where it is under 1.5 times the smaller, and a block id costs one page in each layer of
one group, the widest group's (`_get_kv_cache_bytes_per_block`). So gpt-oss-120b (18 sliding
+ 18 full) has blocks of 18 pages, not 36, and Gemma-3-27B (52 + 10) of 10. State-space
(mamba, linear attention) hybrids pad their state to the attention page,
which kvpilot does not model: for them the bytes per block are left unknown and capacity is
predicted by scaling the server's own figure.

A speculative drafter with attention (EAGLE, EAGLE-3, DFlash, and the MTP modules that
`--speculative-config` names `mtp`) registers its layers in the same config as the target's, so
vLLM sizes their KV with the target's (v1/spec_decode/llm_base_proposer.py `load_model`: the
draft layers are every attention layer the draft added; v1/worker/gpu_model_runner.py
`get_kv_cache_spec` takes every attention layer): a plain model's block is then one page in
each of the target's layers and the draft's. An MTP module has `num_nextn_predict_layers` of
the target's own shape (config/speculative.py reads that key); an EAGLE head has its config's
`num_hidden_layers`, one in every published head. n-gram, suffix, Medusa and MLP speculators
have no attention and no KV. A separate draft model (`draft_model`) or a draft layer of another
shape makes a second group of another page size, which kvpilot does not model: there the
bytes per block are left unknown.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from playbooks.engines.hf_config import (
    LAYERS,
    first_int,
    head_dim,
    kv_heads,
    language_model,
)

Kind = Literal["mha", "mla"]
DSA_QUANT_BLOCK = 128  # the indexer's FP8 keys carry one FP32 scale per 128


@dataclass(frozen=True)
class Geometry:
    kind: Kind
    layers: int  # full-attention layers (all attention layers of a plain model)
    kv_heads: int = 0
    head_size: int = 0
    head_size_v: int = 0
    latent: int = 0  # MLA: kv_lora_rank + qk_rope_head_dim
    indexer: int = 0  # DSA: the indexer keys' bytes per token per layer (uint8, any KV dtype)
    sliding_layers: int = 0
    linear_layers: int = 0  # mamba / linear attention: state, not KV
    kv_quant_fp8: bool = False  # the checkpoint declares an FP8 KV scheme, which `auto` takes
    # The model's own context length (`max_position_embeddings`), above which vLLM refuses a
    # --max-model-len (config/model.py `get_and_verify_max_len`) unless told otherwise.
    max_positions: int | None = None
    # a speculative drafter's attention layers of the target's shape, in the target's blocks;
    # None where a drafter has KV kvpilot cannot place (module docstring)
    draft_layers: int | None = 0

    @property
    def hybrid(self) -> bool:
        return bool(self.sliding_layers or self.linear_layers)

    def kv_heads_per_rank(self, tp: int = 1) -> int:
        return max(1, self.kv_heads // max(1, tp))

    def token_bytes_per_layer(self, dtype_bytes: float, tp: int = 1) -> float:
        """One token of one layer's page on one GPU."""
        if self.kind == "mla":
            return self.latent * dtype_bytes + self.indexer
        return self.kv_heads_per_rank(tp) * (self.head_size + self.head_size_v) * dtype_bytes

    @property
    def layers_per_block(self) -> int | None:
        """The layers whose pages one block id takes (module docstring); None where kvpilot
        cannot say (a state-space hybrid)."""
        if self.linear_layers or self.draft_layers is None:
            return None
        if self.draft_layers and self.sliding_layers:
            return None  # a drafter's full layers regroup a hybrid's: not modelled
        if not self.sliding_layers:
            return self.layers + self.draft_layers
        # `_get_kv_cache_groups_uniform_page_size`: the smaller count, or the larger if
        # under 1.5x it
        fewer, more = sorted((self.layers, self.sliding_layers))
        return more if more < fewer * 1.5 else fewer

    def block_bytes(self, block_size: int, dtype_bytes: float, tp: int = 1) -> float | None:
        """Bytes one KV block takes on one GPU; None for a state-space hybrid."""
        layers = self.layers_per_block
        if layers is None:
            return None
        return block_size * layers * self.token_bytes_per_layer(dtype_bytes, tp)

    def describe(self) -> str:
        if self.kind == "mla":
            shape = f"MLA, latent {self.latent} x {self.layers} layers"
            if self.indexer:
                shape += f", DSA indexer {self.indexer} bytes a layer"
        else:
            shape = (
                f"{self.kv_heads} KV heads x ({self.head_size} + {self.head_size_v}) x "
                f"{self.layers} attention layers"
            )
        extras = [
            *([f"{self.sliding_layers} sliding-window layers"] if self.sliding_layers else []),
            *([f"{self.linear_layers} mamba/linear layers"] if self.linear_layers else []),
            *(["FP8 KV under auto"] if self.kv_quant_fp8 else []),
            *([f"{self.draft_layers} draft layers"] if self.draft_layers else []),
            *(["a drafter's KV of another shape"] if self.draft_layers is None else []),
        ]
        return shape + "".join(f", {e}" for e in extras)


def _layer_kinds(config: Mapping[str, Any], layers: int) -> tuple[int, int, int]:
    """(full, sliding, linear) attention layers: `layer_types` where the config lists them."""
    types = config.get("layer_types")
    if isinstance(types, list) and types:
        sliding = sum(1 for t in types if "sliding" in str(t))
        linear = sum(1 for t in types if "linear" in str(t) or "mamba" in str(t))
        return len(types) - sliding - linear, sliding, linear
    pattern = first_int(config, "sliding_window_pattern")
    if pattern and pattern > 1 and config.get("sliding_window"):  # every Nth layer is full
        full = layers // pattern
        return full, layers - full, 0
    return layers, 0, 0


def _kv_quant_fp8(config: Mapping[str, Any]) -> bool:
    """Whether `auto` resolves to FP8 for this checkpoint: a ModelOpt `kv_cache_quant_algo` or
    an llm-compressor `kv_cache_scheme` of 8-bit floats (vllm/utils/torch_utils.py, the
    checkpoint's KV scheme read before `auto` falls back to the model's dtype)."""
    quant = config.get("quantization_config")
    if not isinstance(quant, Mapping):
        return False
    algo = quant.get("kv_cache_quant_algo")
    if isinstance(algo, str):
        return algo.upper().startswith("FP8")
    scheme = quant.get("kv_cache_scheme")
    return (
        isinstance(scheme, Mapping)
        and scheme.get("num_bits") == 8
        and scheme.get("type", "float") == "float"
    )


def geometry_of(config: Mapping[str, Any]) -> Geometry | None:
    """The geometry, or None for a config kvpilot cannot read (it then says it does not know)."""
    config = language_model(config)
    layers = first_int(config, *LAYERS)
    if not layers:
        return None
    fp8 = _kv_quant_fp8(config)
    positions = first_int(config, "max_position_embeddings")
    lora, rope = first_int(config, "kv_lora_rank"), first_int(config, "qk_rope_head_dim")
    if lora and rope is not None:
        index = first_int(config, "index_head_dim") or 0
        return Geometry(
            "mla",
            layers,
            latent=lora + rope,
            indexer=index + index // DSA_QUANT_BLOCK * 4,
            kv_quant_fp8=fp8,
            max_positions=positions,
        )
    heads = kv_heads(config)
    size = head_dim(config)
    if not heads or not size:
        return None
    full, sliding, linear = _layer_kinds(config, layers)
    if full <= 0:
        return None
    return Geometry(
        "mha",
        full,
        heads,
        size,
        first_int(config, "v_head_dim") or size,
        sliding_layers=sliding,
        linear_layers=linear,
        kv_quant_fp8=fp8,
        max_positions=positions,
    )


# `--speculative-config` methods whose drafter has no attention, so no KV (config/speculative.py
# `SpeculativeMethod`)
NO_DRAFT_KV = frozenset(
    {"ngram", "ngram_gpu", "suffix", "medusa", "mlp_speculator", "custom_class"}
)
EAGLE_HEADS = frozenset({"eagle", "eagle3", "dflash"})
EAGLE_LAYERS = 1  # every published EAGLE / EAGLE-3 head: one decoder layer


def is_mtp(method: str) -> bool:
    """`mtp` and the model-specific names vLLM folds into it (`deepseek_mtp`, ...)."""
    return method == "mtp" or method.endswith("_mtp")


def with_draft(
    geometry: Geometry,
    method: str | None,
    target: Mapping[str, Any],
    draft: Mapping[str, Any] | None = None,
) -> tuple[Geometry, str | None]:
    """The geometry with a speculative drafter's layers added (module docstring), and a note
    where kvpilot assumed or could not place them."""
    if not method or method in NO_DRAFT_KV or method == "extract_hidden_states":
        return geometry, None
    layers, note = None, None
    if is_mtp(method):
        layers = first_int(language_model(target), "num_nextn_predict_layers") or 1
    elif method in EAGLE_HEADS and draft is None:
        layers = EAGLE_LAYERS
        note = (
            f"the {method} head's config.json is not readable here: its KV is taken as "
            f"{EAGLE_LAYERS} layer of the target's shape, as every published head has"
        )
    elif method in EAGLE_HEADS:
        head = geometry_of(draft or {})
        if head is not None and _same_page(head, geometry):
            layers = head.layers
    if layers is not None and not geometry.sliding_layers:
        return replace(geometry, draft_layers=layers), note
    why = (
        "its layers regroup the sliding-window model's pools"
        if layers is not None
        else "it keeps KV of another shape than the target's, which vLLM pools apart"
    )
    return replace(geometry, draft_layers=None), (
        f"the {method} drafter: {why}, which kvpilot does not model; KV bytes per block are "
        "not known, so capacity after a change of memory is not predicted"
    )


def _same_page(a: Geometry, b: Geometry) -> bool:
    return (a.kind, a.kv_heads, a.head_size, a.head_size_v, a.latent, a.indexer) == (
        b.kind,
        b.kv_heads,
        b.head_size,
        b.head_size_v,
        b.latent,
        b.indexer,
    )
