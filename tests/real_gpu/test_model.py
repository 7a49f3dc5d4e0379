"""The GPU model directory (`make_model.py --recipe gpu`): Llama-3-8B's shape and a tokenizer
with exactly the model's 128,256 entries, every one of which decodes. Needs `tokenizers` and
`transformers`, so it runs with the real-SGLang environment's python (the real-SGLang tier)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.real_sglang.harness import sglang_env_available, sglang_venv
from tests.twin_process import REPO

pytestmark = [
    pytest.mark.real_sglang,
    pytest.mark.skipif(
        not sglang_env_available(),
        reason="real SGLang environment not installed (tests/real_sglang/setup.sh)",
    ),
]

MAKE_MODEL = REPO / "tests" / "real_sglang" / "make_model.py"
CHECK = r"""
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
ids = list(range(len(tok)))
texts = tok.batch_decode([[i] for i in ids])
print(json.dumps({
    "entries": len(tok),
    "empty": sum(1 for i, t in zip(ids, texts) if t == "" and i not in tok.all_special_ids),
    "last": texts[-1],
    "round_trip": tok.decode(tok.encode("the server cache", add_special_tokens=False)),
}))
"""


def _build(recipe: str, out: Path) -> str:
    python = str(sglang_venv() / "bin" / "python")
    result = subprocess.run(
        [python, str(MAKE_MODEL), "--recipe", recipe, str(out)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return result.stdout.strip().rsplit("sha256=", 1)[1]


def test_gpu_model_has_llama_3_8b_shape_and_a_full_vocabulary(tmp_path: Path) -> None:
    digest = _build("gpu", tmp_path / "one")
    assert _build("gpu", tmp_path / "two") == digest  # deterministic
    config = json.loads((tmp_path / "one" / "config.json").read_text())
    assert {
        k: config[k]
        for k in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
            "rope_theta",
            "max_position_embeddings",
            "vocab_size",
            "torch_dtype",
        )
    } == {
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "rope_theta": 500000.0,
        "max_position_embeddings": 8192,
        "vocab_size": 128256,
        "torch_dtype": "bfloat16",
    }
    assert "kvpilot_sample_token_id" not in config  # real sampling, not the CPU shim's
    python = str(sglang_venv() / "bin" / "python")
    result = subprocess.run(
        [python, "-c", CHECK, str(tmp_path / "one")],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    seen = json.loads(result.stdout.splitlines()[-1])
    assert seen == {
        "entries": 128256,
        "empty": 0,
        "last": " #128255",
        "round_trip": "the server cache",
    }


def test_cpu_model_is_unchanged_by_the_gpu_recipe(tmp_path: Path) -> None:
    """The CPU conformance server's model keeps its files (and so its recorded digest)."""
    assert _build("cpu", tmp_path / "cpu") == (
        "540fab9f641fa9a770bd24fa4e97584fc079a8a53b9d61f9784826529205008e"
    )
