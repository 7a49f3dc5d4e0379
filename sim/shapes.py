"""Deployment shapes SGLang 0.5.23 derives from the flags: attention DP, speculation, hybrid SWA.

Pure functions over typed data, each following one SGLang function (cited per function), so the
twin's numbers for these shapes come from SGLang's own arithmetic rather than from a fit:

* attention DP splits the TP group into `attn_dp_size` schedulers, each with its own KV pool;
* speculative decoding (EAGLE family) grows the KV cell by the draft's layers and sets a default
  request cap;
* a hybrid SWA model keeps two pools, full and sliding-window, sized by `swa_full_tokens_ratio`.
"""

from __future__ import annotations

from dataclasses import dataclass

# arg_groups/speculative_hook.py::_handle_eagle_family (and the NGRAM/DFLASH handlers): the
# request cap SGLang sets when speculation is on and --max-running-requests is not given.
SPEC_DEFAULT_MAX_RUNNING_REQUESTS = 48
# arg_groups/fields/schedule.py::swa_full_tokens_ratio, its `fallback`.
DEFAULT_SWA_FULL_TOKENS_RATIO = 0.8
# arg_groups/fields/spec.py::speculative_algorithm lists these builtins; the twin models the
# EAGLE family only (the algorithms whose KV sizing pool_configurator.py shares).
EAGLE_FAMILY = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE")


@dataclass(frozen=True)
class Layout:
    """How the GPUs are split, as SGLang 0.5.23 resolves it.

    `dp` counts full replicas (each its own TP group); `attn_dp` counts attention-DP groups inside
    one TP group. Every replica x attention group is one scheduler with its own KV pool.
    """

    tp: int
    dp: int
    attn_dp: int
    attention_tp: int

    @property
    def schedulers(self) -> int:
        return self.dp * self.attn_dp


def resolve_layout(
    tp: int, dp_size: int, attn_dp_size: int, enable_dp_attention: bool, refactored: bool
) -> Layout:
    """`--dp-size N --enable-dp-attention` or `--attn-dp-size N` to a layout; ValueError if bad.

    0.5.23 (arg_groups/parallel_hook.py::handle_deprecated_dp_attention) moves the deprecated
    spelling's width to `attn_dp_size` and sets `dp_size` to 1; `_handle_data_parallelism` then
    refuses replicas combined with attention DP and asserts `tp % attn_dp_size == 0`. The older
    dialect keeps `dp_size` as the attention-DP width.
    """
    if attn_dp_size < 1:
        raise ValueError(f"attn_dp_size must be at least 1, got {attn_dp_size}")
    attn_dp = attn_dp_size
    dp = dp_size
    if enable_dp_attention and attn_dp == 1:
        attn_dp, dp = dp_size, 1
    if attn_dp > 1 and dp > 1:
        raise ValueError(
            f"--dp-size {dp} with --attn-dp-size {attn_dp}: data-parallel replicas combined "
            "with attention data parallelism are not supported."
        )
    if tp % attn_dp:
        raise ValueError(f"tp_size ({tp}) must be divisible by attn_dp_size ({attn_dp})")
    if not refactored and attn_dp > 1:
        # 0.5.5 reports the attention-DP width as dp_size; the schedulers are the same.
        return Layout(tp=tp, dp=1, attn_dp=attn_dp, attention_tp=tp // attn_dp)
    return Layout(tp=tp, dp=dp, attn_dp=attn_dp, attention_tp=tp // attn_dp)


def dp_attention_graph_reserve_mib(cuda_graph_max_bs: int, attn_dp_size: int) -> float:
    """The reserve DP attention adds to the default fraction's headroom, in MiB.

    arg_groups/memory_hook.py::reserve_for_graph_mb: `max_bs * attn_dp * 3`, and another
    `max_bs * attn_dp * 1.5` when the decode graph's max batch exceeds 300.
    """
    if attn_dp_size <= 1:
        return 0.0
    reserve = cuda_graph_max_bs * attn_dp_size * 3.0
    if cuda_graph_max_bs > 300:
        reserve += cuda_graph_max_bs * attn_dp_size * 1.5
    return reserve


def per_rank_chunked_prefill(chunked_prefill_size: int, attn_dp_size: int) -> int:
    """parallel_hook.py::_handle_data_parallelism: the chunk is split across attention-DP ranks."""
    if attn_dp_size <= 1 or chunked_prefill_size <= 0:
        return chunked_prefill_size
    return chunked_prefill_size // attn_dp_size


def per_rank_conservativeness(schedule_conservativeness: float, attn_dp_size: int) -> float:
    """parallel_hook.py::_handle_data_parallelism multiplies it by 0.3 under attention DP."""
    return schedule_conservativeness * 0.3 if attn_dp_size > 1 else schedule_conservativeness


@dataclass(frozen=True)
class Speculation:
    """Speculative decoding as resolved: the algorithm SGLang reports and the draft's shape."""

    algorithm: str  # NEXTN resolves to EAGLE (speculative_hook.py::_resolve_...alias)
    num_steps: int
    eagle_topk: int
    num_draft_tokens: int
    draft_layers: int  # layers whose KV the draft keeps in the target's pool


def resolve_speculation(
    algorithm: str | None,
    architecture: str,
    nextn_layers: int,
    draft_model_path: str | None,
    num_steps: int | None,
    eagle_topk: int | None,
    num_draft_tokens: int | None,
) -> Speculation | None:
    """The EAGLE family's resolution, or None without speculation; ValueError when unsupported.

    Algorithm alias: speculative_hook.py::_resolve_speculative_algorithm_alias (NEXTN -> EAGLE).
    Auto parameters: speculative_hook.py::_auto_choose_speculative_params (Llama 5/4/8, the rest
    3/1/4). Draft layers: model_runner_components/spec_aux_hidden_state.py: the checkpoint's
    `num_nextn_predict_layers` (MTP heads), else the draft model's layers (published EAGLE and
    EAGLE3 heads have one).
    """
    if algorithm is None:
        return None
    if algorithm not in EAGLE_FAMILY:
        raise ValueError(f"the twin models the EAGLE family only, not {algorithm!r}")
    if nextn_layers <= 0 and draft_model_path is None:
        raise ValueError(f"{algorithm} needs --speculative-draft-model-path for this model")
    resolved = "EAGLE" if algorithm == "NEXTN" else algorithm
    if num_steps is None:
        auto = (5, 4, 8) if architecture == "LlamaForCausalLM" else (3, 1, 4)
        if resolved == "STANDALONE":
            auto = (3, 1, 4)
        num_steps, eagle_topk, num_draft_tokens = auto
    return Speculation(
        algorithm=resolved,
        num_steps=num_steps,
        eagle_topk=eagle_topk if eagle_topk is not None else 1,
        num_draft_tokens=num_draft_tokens if num_draft_tokens is not None else num_steps + 1,
        draft_layers=nextn_layers if nextn_layers > 0 else 1,
    )


def draft_cell_bytes(target_cell: int, draft_layers: int, target_layers: int) -> int:
    """pool_configurator.py::DefaultPoolConfigurator.__init__ (EAGLE/STANDALONE branch).

    `cell += int(cell * draft_layers / num_layers)`: the draft's KV shares the target's
    per-layer size and lives in the same token slots.
    """
    return int(target_cell * draft_layers / target_layers)


@dataclass(frozen=True)
class KvShape:
    """Bytes per token of each pool on one GPU; `swa_cell` is 0 for a model without SWA layers."""

    full_cell: int  # full-attention layers (plus the draft's), per full-pool token
    swa_cell: int = 0  # sliding-window layers, per SWA-pool token
    swa_ratio: float = DEFAULT_SWA_FULL_TOKENS_RATIO

    @property
    def hybrid(self) -> bool:
        return self.swa_cell > 0

    @property
    def profile_cell(self) -> float:
        """pool_configurator.py::HybridSWAPoolConfigurator._recompute_cell_size (hybrid case).

        Bytes of GPU memory one token of `max_total_num_tokens` costs: its full-pool row plus
        `swa_full_tokens_ratio` of an SWA-pool row.
        """
        if not self.hybrid:
            return float(self.full_cell)
        return self.full_cell + self.swa_ratio * self.swa_cell

    def swa_tokens(self, full_tokens: int, page_size: int) -> int:
        """pool_configurator.py::HybridSWAPoolConfigurator._solve_pool_sizes: ratio, paged."""
        return int(full_tokens * self.swa_ratio) // page_size * page_size

    def pool_bytes(self, full_tokens: int, page_size: int) -> int:
        """Both pools' bytes, with the page of padding rows each pool keeps."""
        full = (full_tokens + page_size) * self.full_cell
        if not self.hybrid:
            return full
        return full + (self.swa_tokens(full_tokens, page_size) + page_size) * self.swa_cell
