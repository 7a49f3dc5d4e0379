"""Build the weightless model directory the real-SGLang conformance server loads.

The directory holds a ``config.json`` with the shape of Llama-3.1-8B (that shape is all the KV-cache
sizing reads) and a small byte-level BPE tokenizer trained here, offline, from a fixed corpus.
There are no weights: the shim replaces ``ModelRunner.load_model``.

Run it with the SGLang venv's python (it needs the ``tokenizers`` package)::

    .venv-sglang/bin/python tests/real_sglang/make_model.py [OUT_DIR]

The output is deterministic. A file ``.kvpilot-model-version`` records the recipe version; a second
run with the same version is a no-op.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if not __package__:  # run as a script, by the SGLang environment's python
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests import local_model
from tests.local_model import BOS, IM_END

# Bump when anything below changes the produced files.
RECIPE_VERSION = "2"

# Llama-3.1-8B attention shape: 32 layers x 8 KV heads x head_dim 128.
NUM_LAYERS = 32
NUM_HEADS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 128
HIDDEN = 4096
INTERMEDIATE = 14336
VOCAB_SIZE = 128256
# As Llama-3.1-8B; launch.py passes --context-length 8192 unless told otherwise.
CONTEXT_LENGTH = 131072

TOKENIZER_VOCAB = 400
_WORDS = [
    "the",
    "a",
    "an",
    "of",
    "to",
    "in",
    "for",
    "on",
    "with",
    "by",
    "is",
    "are",
    "was",
    "be",
    "as",
    "at",
    "from",
    "this",
    "that",
    "it",
    "its",
    "and",
    "or",
    "not",
    "server",
    "request",
    "requests",
    "token",
    "tokens",
    "cache",
    "prefix",
    "radix",
    "memory",
    "pool",
    "batch",
    "decode",
    "prefill",
    "latency",
    "throughput",
    "queue",
    "running",
    "waiting",
    "model",
    "weights",
    "layer",
    "layers",
    "head",
    "heads",
    "page",
    "size",
    "gpu",
    "cpu",
    "host",
    "device",
    "ratio",
    "fraction",
    "static",
    "total",
    "max",
    "min",
    "time",
    "first",
    "output",
    "input",
    "chat",
    "user",
    "assistant",
    "system",
    "hello",
    "world",
    "please",
    "tell",
    "me",
    "about",
    "how",
    "what",
    "when",
    "why",
    "which",
    "number",
    "value",
    "tune",
    "tuning",
    "restart",
    "metric",
    "metrics",
    "health",
    "ready",
    "load",
    "loads",
    "info",
    "usage",
    "capacity",
    "context",
]


# A fixed pseudo-random text corpus for the tokenizer.
CORPUS = local_model.Corpus(_WORDS, seed=12345, lines=600, per_line=12, modulo=10000)


def _model_config(vocab_size: int, bos_id: int, eos_id: int, sample_id: int) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": CONTEXT_LENGTH,
        "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": vocab_size,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": None,
        # Read by the shim: the token id every simulated sampling step returns.
        "kvpilot_sample_token_id": sample_id,
        "kvpilot_note": "weightless Llama-3.1-8B-shaped model for the real-SGLang test harness",
    }


def _write(folder: Path) -> None:
    tok = local_model.train_tokenizer(CORPUS, TOKENIZER_VOCAB)
    vocab = tok.get_vocab()
    bos_id, eos_id = vocab[BOS], vocab[IM_END]
    # " token" in byte-level BPE spelling; generated text reads " token token token ...".
    sample_id = vocab.get("\u0120token", vocab["t"])
    local_model.write_json(
        folder / "config.json", _model_config(VOCAB_SIZE, bos_id, eos_id, sample_id)
    )
    local_model.write_tokenizer(
        folder, tok, CONTEXT_LENGTH, {"bos_token_id": bos_id, "eos_token_id": eos_id}
    )


def build(out_dir: Path) -> Path:
    """Write the model directory to ``out_dir`` (atomically) unless it is already current."""
    return local_model.build(out_dir, RECIPE_VERSION, _write)


def default_dir() -> Path:
    return local_model.venv_dir("KVPILOT_SGLANG_VENV", ".venv-sglang") / "kvpilot-model"


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else default_dir()
    path = build(out)
    print(f"{path} sha256={local_model.digest(path)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
