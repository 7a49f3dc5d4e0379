"""Real SGLang 0.5.23's own arithmetic as the judge of kvpilot's predictions.

``judge(shapes)`` runs ``sglang_side.py`` once, in the SGLang virtual environment, and returns
for each deployment shape what SGLang itself would configure: the resolved server arguments
(mem_fraction_static, chunked prefill, decode graph max bs, max_running_requests, attn_dp_size,
kv_cache_dtype, page_size, ...), the reserve it derived the fraction from, the KV pool (cell
size, token capacity, SWA pool, mamba state, per-DP request cap), the HiCache host pool of one
rank, or the refusal SGLang raises, and a ``/server_info`` reply shaped like the real server's.
Shapes need not fit this machine (TP8, DP attention, MLA, speculative decoding, FP8 checkpoints,
hybrid models): only SGLang's device and host probes are answered from the shape.

Importable from the main virtual environment: this module imports neither sglang nor torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .models import MODELS, write_models

HERE = Path(__file__).resolve().parent
SIDE = HERE / "sglang_side.py"
REPO = HERE.parents[2]


@dataclass
class Shape:
    """One deployment: a model of ``models.MODELS``, ``sglang serve`` flags (without
    ``--model-path``), the GPU (``gpu_mib`` = nvidia-smi memory.total), the free GPU memory
    before the weights load (``pre_gib``, GiB) and the weights per GPU (``weights_gib``)."""

    name: str
    model: str
    args: list[str]
    gpu_mib: float
    pre_gib: float
    weights_gib: float
    host_available_gib: float | None = None
    host_cgroup_limit_gib: float | None = None
    ranks_per_host: int = 1
    nnodes: int = 1


class JudgeError(RuntimeError):
    """The SGLang side did not run to the end."""


def sglang_python(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    return Path(env.get("KVPILOT_SGLANG_VENV") or REPO / ".venv-sglang") / "bin" / "python"


def side_env(base: dict[str, str]) -> dict[str, str]:
    """The environment of ``sglang_side.py``: offline, one thread, no GPU."""
    return {
        **base,
        "CUDA_VISIBLE_DEVICES": "",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }


def judge_with_timing(
    shapes: list[Shape], timeout_s: float = 600
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``judge`` plus the SGLang side's timing: start-up seconds and ms per case."""
    unknown = sorted({s.model for s in shapes} - set(MODELS))
    if unknown:
        raise ValueError(f"unknown model(s) {unknown}; known: {sorted(MODELS)}")
    with tempfile.TemporaryDirectory(prefix="kvpilot-judge-") as tmp:
        root = Path(tmp)
        dirs = write_models(root / "models", sorted({s.model for s in shapes}))
        cases = [{**asdict(s), "model_dir": dirs[s.model]} for s in shapes]
        (root / "in.json").write_text(json.dumps({"cases": cases}))
        proc = subprocess.run(
            [str(sglang_python()), str(SIDE), str(root / "in.json"), str(root / "out.json")],
            env=side_env(dict(os.environ)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if proc.returncode != 0 or not (root / "out.json").exists():
            raise JudgeError(f"sglang_side.py exited {proc.returncode}:\n{proc.stdout[-4000:]}")
        out = json.loads((root / "out.json").read_text())
    return out["results"], out["timing"]


def judge(shapes: list[Shape]) -> list[dict[str, Any]]:
    """What real SGLang 0.5.23 configures for each shape, in order (one subprocess)."""
    return judge_with_timing(shapes)[0]


__all__ = ["MODELS", "JudgeError", "Shape", "judge", "judge_with_timing"]
