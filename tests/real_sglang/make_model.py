"""Build the weightless model directories the real SGLang loads, on CPU and on a real GPU.

Each directory holds a ``config.json`` with the shape of Llama-3(.1)-8B (that shape is all the
KV-cache sizing reads) and a small byte-level BPE tokenizer trained here, offline, from a fixed
corpus. There are no weights. Two recipes:

* ``cpu`` (default): for the CPU conformance server, whose shim replaces
  ``ModelRunner.load_model`` and samples one fixed token id (``kvpilot_sample_token_id``);
  context 131,072 as Llama-3.1-8B.
* ``gpu``: for the real SGLang on a GPU (``tests/real_gpu/``), started with ``--load-format
  dummy`` (random weights): Llama-3-8B's context of 8,192, and the tokenizer's vocabulary padded
  to exactly the model's 128,256 entries so that every id random weights can sample decodes.

Run it with a python that has the ``tokenizers`` package (the SGLang venv's, or any with the
GPU bundle's ``tokenizers`` on its path)::

    .venv-sglang/bin/python tests/real_sglang/make_model.py [--recipe gpu] [OUT_DIR]

The output is deterministic. A file ``.kvpilot-model-version`` records the recipe version; a second
run with the same version is a no-op.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if not __package__:  # run as a script, by the SGLang environment's python
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests import local_model
from tests.local_model import BOS, IM_END

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
LLAMA_3_CONTEXT_LENGTH = 8192

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


@dataclass(frozen=True)
class Recipe:
    """What differs between the model directories; `version` changes with any produced file."""

    name: str
    version: str
    context_length: int  # max_position_embeddings
    pad_vocabulary: bool  # the tokenizer gets exactly VOCAB_SIZE entries
    sample_token: bool  # the CPU shim's fixed sampled id in config.json
    note: str


RECIPES = {
    "cpu": Recipe(
        "cpu",
        "2",
        CONTEXT_LENGTH,
        pad_vocabulary=False,
        sample_token=True,
        note="weightless Llama-3.1-8B-shaped model for the real-SGLang test harness",
    ),
    "gpu": Recipe(
        "gpu",
        "gpu-1",
        LLAMA_3_CONTEXT_LENGTH,
        pad_vocabulary=True,
        sample_token=False,
        note="Llama-3-8B shape for the real SGLang on a GPU with --load-format dummy",
    ),
}
# The CPU recipe's version, as the harnesses that check the CPU model read it.
RECIPE_VERSION = RECIPES["cpu"].version


def _model_config(
    recipe: Recipe, vocab_size: int, bos_id: int, eos_id: int, sample_id: int
) -> dict[str, Any]:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": recipe.context_length,
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
    }
    if recipe.sample_token:
        # Read by the shim: the token id every simulated sampling step returns.
        config["kvpilot_sample_token_id"] = sample_id
    config["kvpilot_note"] = recipe.note
    return config


def _writer(recipe: Recipe) -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        tok = local_model.train_tokenizer(CORPUS, TOKENIZER_VOCAB)
        vocab = tok.get_vocab()
        bos_id, eos_id = vocab[BOS], vocab[IM_END]
        # " token" in byte-level BPE spelling; generated text reads " token token token ...".
        sample_id = vocab.get("\u0120token", vocab["t"])
        if recipe.pad_vocabulary:
            tok = local_model.pad_vocabulary(tok, VOCAB_SIZE)
        local_model.write_json(
            folder / "config.json", _model_config(recipe, VOCAB_SIZE, bos_id, eos_id, sample_id)
        )
        local_model.write_tokenizer(
            folder, tok, recipe.context_length, {"bos_token_id": bos_id, "eos_token_id": eos_id}
        )

    return write


def build(out_dir: Path, recipe: Recipe = RECIPES["cpu"]) -> Path:
    """Write the model directory to ``out_dir`` (atomically) unless it is already current."""
    return local_model.build(out_dir, recipe.version, _writer(recipe))


def default_dir() -> Path:
    return local_model.venv_dir("KVPILOT_SGLANG_VENV", ".venv-sglang") / "kvpilot-model"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="make_model.py", description=__doc__.split("\n")[0])
    p.add_argument("--recipe", choices=sorted(RECIPES), default="cpu")
    p.add_argument("out", nargs="?", type=Path, default=None, help="the model directory")
    ns = p.parse_args(argv)
    path = build(ns.out or default_dir(), RECIPES[ns.recipe])
    print(f"{path} sha256={local_model.digest(path)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
