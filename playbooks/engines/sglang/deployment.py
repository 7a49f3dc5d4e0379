"""A running server's deployment shape, read from its resolved arguments across versions.

SGLang renamed the parallelism and CUDA-graph arguments in 0.5.23 (`arg_groups/fields/*.py`):
`--enable-dp-attention` with `--dp-size N` became `--attn-dp-size N` (the old spelling still
parses and is folded into the new one), and `--cuda-graph-max-bs` / `--disable-cuda-graph`
became per-phase `cuda_graph_max_bs_decode` and `cuda_graph_backend_{decode,prefill}`.
"""

from __future__ import annotations

from playbooks.engines.sglang.client import ServerInfo
from playbooks.engines.sglang.geometry import Geometry
from playbooks.engines.sglang.reserve import Deployment

# SGLang's GPU table (MiB total -> chunked prefill, decode graph max bs at tp < 4 / tp >= 4),
# `arg_groups/memory_hook.py::handle_gpu_memory_settings` (0.5.23; < 35 GiB differs in 0.5.5).
GPU_TABLE = (
    (20 * 1024, 2048, 8, 8),
    (35 * 1024, 4096, 48, 160),
    (60 * 1024, 4096, 32, 160),
    (90 * 1024, 8192, 256, 512),
    (160 * 1024, 8192, 256, 512),
)
LARGE_GPU = (16384, 512, 512)
OLD_BELOW_35_GIB = (2048, 24, 80)  # before 0.5.20 (server_args.py _handle_gpu_memory_settings)
MLA_BACKENDS = ("flashmla", "cutlass_mla", "trtllm_mla", "flashinfer_mla", "triton_mla")


def parse_version(text: str) -> tuple[int, int, int]:
    parts = []
    for piece in text.lstrip("v").split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    while len(parts) < 3:
        parts.append(0)
    return (parts[0], parts[1], parts[2])


def _int(value: object, default: int) -> int:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    return default


def gpu_defaults(
    gpu_mib: float, tp: int, version: tuple[int, int, int] = (0, 5, 23)
) -> tuple[int, int]:
    """SGLang's chunked prefill size and decode CUDA-graph max batch for this GPU."""
    for limit, *row in GPU_TABLE:
        if gpu_mib < limit:
            old = limit == 35 * 1024 and version < (0, 5, 20)
            chunk, small, large = OLD_BELOW_35_GIB if old else row
            return chunk, small if tp < 4 else large
    return LARGE_GPU[0], LARGE_GPU[1]


def attn_dp_size(info: ServerInfo) -> int:
    """Attention-DP ranks: 1 without DP attention."""
    if info.arg("attn_dp_size") is not None:
        return max(1, _int(info.arg("attn_dp_size"), 1))
    if info.arg("enable_dp_attention"):
        return max(1, _int(info.arg("dp_size"), 1))
    return 1


def dp_replicas(info: ServerInfo) -> int:
    """Whole-model replicas behind SGLang's DP controller (`--dp-size N` without attention DP):
    each a scheduler with its own KV pool and the whole `--max-running-requests`, of which
    /server_info reports the first's pool (0.5.23 `data_parallel_controller.py`). Replicas and
    attention DP exclude each other (`arg_groups/parallel_hook.py`)."""
    if attn_dp_size(info) > 1:
        return 1
    return max(1, _int(info.arg("dp_size"), 1))


def schedulers(info: ServerInfo) -> int:
    """Schedulers with a KV pool of their own: attention-DP ranks, or replicas."""
    return attn_dp_size(info) * dp_replicas(info)


def decode_max_bs(info: ServerInfo, gpu_mib: float) -> int:
    for name in ("cuda_graph_max_bs_decode", "cuda_graph_max_bs"):
        if isinstance(info.arg(name), int):
            return int(info.arg(name))
    nested = info.arg("cuda_graph_config")
    if isinstance(nested, dict) and isinstance(nested.get("decode"), dict):
        value = nested["decode"].get("max_bs")
        if isinstance(value, int):
            return value
    version = parse_version(info.version)
    return gpu_defaults(gpu_mib, info.tp_size, version)[1]


def _graphs_on(info: ServerInfo, phase: str) -> bool:
    """0.5.23's resolved `cuda_graph_config.<phase>.backend` decides (the per-phase flags stay
    None there); older releases have the flags only."""
    nested = info.arg("cuda_graph_config")
    if isinstance(nested, dict) and isinstance(nested.get(phase), dict):
        backend = nested[phase].get("backend")
        if backend is not None:
            return str(backend).lower() != "disabled"
    if info.arg("disable_cuda_graph") or info.arg(f"disable_{phase}_cuda_graph"):
        return False
    return str(info.arg(f"cuda_graph_backend_{phase}") or "").lower() != "disabled"


def is_mla(info: ServerInfo, geometry: Geometry | None) -> bool:
    if geometry is not None:
        return geometry.mla
    backend = str(info.arg("attention_backend") or info.arg("decode_attention_backend") or "")
    return backend in MLA_BACKENDS


def post_capture_kv_sizing(info: ServerInfo) -> bool:
    """Whether the server sizes its pool after capturing CUDA graphs. SGLang reports its own
    environment only with SGLANG_EXPOSE_OWN_ENV_VARS=1 (`internal_state.py::_add_env_vars`);
    without it the default (off) is assumed."""
    states = info.raw.get("internal_states")
    first = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    env = first.get("env_vars")
    if not isinstance(env, dict):
        return False
    return str(env.get("SGLANG_ENABLE_POST_CAPTURE_KV_SIZING", "")).lower() in ("1", "true")


def deployment_of(
    info: ServerInfo, gpu_mib: float, version: tuple[int, int, int], geometry: Geometry | None
) -> Deployment:
    chunk_default, _ = gpu_defaults(gpu_mib, info.tp_size, version)
    ranks = attn_dp_size(info)
    chunk = _int(info.arg("chunked_prefill_size"), chunk_default)
    if ranks > 1 and chunk > 0:
        # parallel_hook.py::_handle_data_parallelism divides the chunk by the attention-DP size
        # after memory_hook.py has sized the reserve with the whole one.
        chunk *= ranks
    return Deployment(
        gpu_mib=gpu_mib,
        tp=info.tp_size,
        pp=_int(info.arg("pp_size"), 1),
        chunked_prefill_size=chunk,
        max_prefill_tokens=_int(info.arg("max_prefill_tokens"), 16384),
        decode_max_bs=decode_max_bs(info, gpu_mib),
        attn_dp=ranks,
        mla=is_mla(info, geometry),
        deepep=str(info.arg("moe_a2a_backend") or "") == "deepep",
        decode_graphs=_graphs_on(info, "decode"),
        prefill_graphs=_graphs_on(info, "prefill"),
        speculative=info.arg("speculative_algorithm") or None,
        version=version,
        post_capture=post_capture_kv_sizing(info),
        vision=vision_of(info, geometry),
    )


def vision_of(info: ServerInfo, geometry: Geometry | None) -> tuple[int, int] | None:
    """The image encoder SGLang keeps room for: a VLM's, unless it serves the language model
    alone (`--language-only`, `--language-model-only`) or is a decode node (`memory_hook.py`
    `is_vlm`)."""
    if geometry is None or geometry.vision is None:
        return None
    if info.arg("language_only") or info.arg("language_model_only"):
        return None
    if str(info.arg("disaggregation_mode") or "null") == "decode":
        return None
    return geometry.vision
