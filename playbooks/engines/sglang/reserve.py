"""The GPU memory SGLang's own defaults keep outside the static pool, per GPU and deployment.

SGLang chooses `--mem-fraction-static` so that a reserve `R` (MiB) stays free for activations
and CUDA graphs: `fraction = round((gpu_mem - R) / gpu_mem, 3)`, `gpu_mem` being nvidia-smi's
total. In 0.5.23 (`sglang/srt/arg_groups/memory_hook.py::handle_gpu_memory_settings`,
`reserve_for_graph_mb`, `reserve_for_deepep_a2a_mb`):

    R = 512 + 1.5 * max(chunked_prefill_size, 2048) + tp * pp / 8 * 1024 + graphs
    graphs = 2 * decode_max_bs                                   (decode CUDA graphs on)
           + 3 * decode_max_bs * attn_dp  (+1.5 * ... above bs 300)   (DP attention)
           + 8 * len(prefill capture sizes) | 1536 for MLA            (prefill graphs on)
    R = max(R, 10240) on GPUs over 60 GiB;  R += 2048 with DeepEP all-to-all

Earlier releases (`server_args.py::ServerArgs._handle_gpu_memory_settings`) differ in three
terms: the prefill-graph term arrives in 0.5.10 (piecewise graphs, on by default); speculative
decoding adds, after the floor, 2048 MiB before 0.5.10 and 4096 MiB in 0.5.10-0.5.13 (6144 for
STANDALONE, nothing for NGRAM), and nothing from 0.5.14; DeepEP's 2048 MiB arrives in 0.5.16.

A vision-language model (SGLang's `is_multimodal`, unless `--language-only` or a decode node)
gets a lower default: the fraction above times 0.95 times
`clamp(1 - 0.1 x (L x H**2 / (24 x 1024**2) - 1), 0.8, 1.05)` for an image encoder of L layers
of width H (`adjust_mem_fraction_for_vlm`; with post-capture sizing, 8 GiB less instead). That
is room kept for the encoder's activations, and kvpilot counts it in the reserve and its floor:
a fraction above a VLM's own default leaves the first batch of large images short.

kvpilot's rule: a fraction is *recommended* only where what stays outside the static pool
covers `floor_mib` (the part of `R` SGLang never goes below: the 10 GiB floor or the fixed and
graph terms, plus the DeepEP and DP-attention terms), and the measured activation room holds.
The 1.5 MB per prefill token term is SGLang's estimate of activations; kvpilot checks
activations against the server's measured graph memory instead, and names SGLang's full
default reserve as the risk of a closer fraction.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

MIB_PER_GIB = 1024
BASE_MIB = 512  # constant metadata (attention backends)
MIB_PER_ACTIVATION_TOKEN = 1.5
MIN_ACTIVATION_TOKENS = 2048
FLOOR_MIB = 10 * 1024  # on GPUs over 60 GiB
FLOOR_ABOVE_MIB = 60 * 1024
DEEPEP_MIB = 2 * 1024
MLA_PREFILL_GRAPH_MIB = 1.5 * 1024
SPECULATIVE_MIB_OLD = 2048  # before 0.5.10: EAGLE, EAGLE3, NEXTN (MTP)
SPECULATIVE_MIB_0510 = 4096  # 0.5.10-0.5.13
STANDALONE_MIB_OLD = 6144
DP_LARGE_BS = 300


def prefill_capture_sizes(max_bs: int) -> list[int]:
    """0.5.23's prefill CUDA-graph capture sizes up to `max_bs` tokens
    (`arg_groups/cuda_graph_hook.py::generate_prefill_cuda_graph_batch_sizes`)."""
    sizes = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1025, 64))
        + list(range(1280, 4097, 256))
        + list(range(4608, max_bs + 1, 512))
    )
    return [s for s in sizes if s <= max_bs]


@dataclass(frozen=True)
class Deployment:
    """What SGLang's reserve depends on, as the server's resolved arguments say it."""

    gpu_mib: float  # nvidia-smi memory.total (the smallest GPU)
    tp: int = 1
    pp: int = 1
    chunked_prefill_size: int = 8192  # -1: chunking off, max_prefill_tokens counts instead
    max_prefill_tokens: int = 16384
    decode_max_bs: int = 256
    attn_dp: int = 1  # attention-DP ranks; 1 without DP attention
    mla: bool = False
    deepep: bool = False
    decode_graphs: bool = True
    prefill_graphs: bool = True  # 0.5.23's default prefill backend captures graphs on CUDA
    prefill_graph_max_bs: int | None = None  # defaults to the chunk (MLA: at most 8192)
    speculative: str | None = None  # algorithm name, None without speculation
    version: tuple[int, int, int] = (0, 5, 23)
    # SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=1 (0.5.23, not for MLA): the pool is sized after
    # the CUDA graphs are captured, so the graphs sit inside the fraction and the reserve is
    # only 1536 MiB plus the TP x PP slack (`memory_hook.py`, `overrides.py::
    # post_capture_kv_sizing_planned`).
    post_capture: bool = False
    # the image encoder of a vision-language model, (layers, hidden), as `Geometry.vision`
    vision: tuple[int, int] | None = None

    @property
    def new_layout(self) -> bool:
        return self.version >= (0, 5, 23)

    def since(self, *version: int) -> bool:
        return self.version >= version


@dataclass(frozen=True)
class Reserve:
    """SGLang's default reserve for one deployment, and the part kvpilot treats as a floor."""

    total_mib: float  # what SGLang's default fraction keeps free
    floor_mib: float  # what a recommended fraction must keep free
    activation_mib: float  # SGLang's 1.5 MB-per-token activation estimate
    graph_mib: float
    parts: tuple[tuple[str, float], ...]
    rule_mib: float = 0.0  # SGLang's `reserved_mem` before a VLM's cut (0: the total)
    vision_factor: float = 1.0  # a VLM's default fraction is the rule's times this
    vision_gib_cut: float = 0.0  # with post-capture sizing: 8 GiB off a VLM's fraction

    @property
    def total_gib(self) -> float:
        return self.total_mib / MIB_PER_GIB

    @property
    def floor_gib(self) -> float:
        return self.floor_mib / MIB_PER_GIB

    def default_fraction(self, gpu_mib: float) -> float:
        """SGLang's own `--mem-fraction-static` when unset (`memory_hook.py`)."""
        rule = round((gpu_mib - (self.rule_mib or self.total_mib)) / gpu_mib, 3)
        if self.vision_gib_cut:
            return rule - self.vision_gib_cut * MIB_PER_GIB / gpu_mib
        return rule * self.vision_factor


def _dp_padding_mib(d: Deployment) -> float:
    if d.attn_dp <= 1:
        return 0.0
    pad = d.decode_max_bs * d.attn_dp * 3.0
    if d.decode_max_bs > DP_LARGE_BS:
        pad += d.decode_max_bs * d.attn_dp * 1.5
    return pad


def _prefill_graph_mib(d: Deployment) -> float:
    if not (d.since(0, 5, 10) and d.prefill_graphs):
        return 0.0
    if d.mla:
        return MLA_PREFILL_GRAPH_MIB
    chunk = d.chunked_prefill_size if d.chunked_prefill_size > 0 else d.max_prefill_tokens
    max_bs = d.prefill_graph_max_bs or chunk
    return 8.0 * len(prefill_capture_sizes(max_bs))


def _beyond_floor_mib(d: Deployment) -> tuple[tuple[str, float], ...]:
    """Terms SGLang adds after the floor is applied."""
    parts: list[tuple[str, float]] = []
    if d.since(0, 5, 16) and d.deepep and d.decode_graphs:
        parts.append(("DeepEP all-to-all buffers", DEEPEP_MIB))
    algorithm = (d.speculative or "").upper()
    if algorithm and algorithm != "NGRAM" and not d.since(0, 5, 14):
        if algorithm == "STANDALONE":
            extra = STANDALONE_MIB_OLD
        else:
            extra = SPECULATIVE_MIB_0510 if d.since(0, 5, 10) else SPECULATIVE_MIB_OLD
        parts.append((f"speculative decoding ({d.speculative})", extra))
    return tuple(parts)


VLM_BASE_FACTOR = 0.95  # adjust_mem_fraction_for_vlm: a regular ViT's cut
VIT_BASELINE = 24 * 1024**2  # ViT-L/14: 24 layers of 1024
VLM_POST_CAPTURE_GIB = 8.0


def vision_factor(vision: tuple[int, int]) -> float:
    """What SGLang multiplies a VLM's default fraction by, for an encoder of (layers, hidden)."""
    layers, hidden = vision
    ratio = layers * hidden**2 / VIT_BASELINE
    return VLM_BASE_FACTOR * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))


def _with_vision(d: Deployment, r: Reserve) -> Reserve:
    """The reserve of a VLM: SGLang's rule, then the encoder's room its lower default keeps."""
    if d.vision is None:
        return r
    rule = round((d.gpu_mib - r.total_mib) / d.gpu_mib, 3)
    if d.post_capture and d.since(0, 5, 16) and not d.mla:
        factor, cut = 1.0, VLM_POST_CAPTURE_GIB
        room = cut * MIB_PER_GIB
    else:
        factor, cut = vision_factor(d.vision), 0.0
        room = d.gpu_mib * rule * (1.0 - factor)
    layers, hidden = d.vision
    part = (f"image encoder ({layers} layers x {hidden})", room)
    return replace(
        r,
        total_mib=r.total_mib + room,
        floor_mib=r.floor_mib + room,
        parts=(*r.parts, part),
        rule_mib=r.total_mib,
        vision_factor=factor,
        vision_gib_cut=cut,
    )


POST_CAPTURE_MIB = 1536  # 0.5.18 on
POST_CAPTURE_MIB_0516 = 512  # 0.5.16, 0.5.17


def sglang_reserve(d: Deployment) -> Reserve:
    """SGLang's own default reserve for this deployment, term by term."""
    return _with_vision(d, _text_reserve(d))


def _text_reserve(d: Deployment) -> Reserve:
    """SGLang's `reserved_mem` (memory_hook.py), before a VLM's cut."""
    if d.post_capture and d.since(0, 5, 16) and not d.mla:
        base = POST_CAPTURE_MIB if d.since(0, 5, 18) else POST_CAPTURE_MIB_0516
        total = base + d.tp * d.pp / 8 * MIB_PER_GIB
        return Reserve(total, total, 0.0, 0.0, (("post-capture sizing floor and slack", total),))
    chunk = d.chunked_prefill_size if d.chunked_prefill_size > 0 else d.max_prefill_tokens
    activation = MIB_PER_ACTIVATION_TOKEN * max(chunk, MIN_ACTIVATION_TOKENS)
    scale_out = d.tp * d.pp / 8 * MIB_PER_GIB
    decode = 2.0 * d.decode_max_bs if d.decode_graphs else 0.0
    dp = _dp_padding_mib(d)
    graph = decode + dp + _prefill_graph_mib(d)
    fixed = BASE_MIB + scale_out + graph
    floor = FLOOR_MIB if d.gpu_mib > FLOOR_ABOVE_MIB else 0.0
    beyond = _beyond_floor_mib(d)
    extra = sum(v for _, v in beyond)
    total = max(fixed + activation, floor) + extra
    parts = (
        ("metadata", float(BASE_MIB)),
        (f"activations for {max(chunk, MIN_ACTIVATION_TOKENS):,} prefill tokens", activation),
        (f"TP{d.tp}xPP{d.pp} slack", scale_out),
        ("CUDA graphs", decode + _prefill_graph_mib(d)),
        *((("DP-attention padding", dp),) if dp else ()),
        *beyond,
    )
    # The floor kvpilot holds a recommendation to: SGLang's floor, never below its fixed and
    # graph terms, with the DP padding and the terms beyond the floor on top.
    rule_floor = min(total, max(floor, fixed - dp) + dp + extra)  # never above SGLang's own
    return Reserve(total, rule_floor, activation, graph, parts)
