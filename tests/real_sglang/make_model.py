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

import fcntl
import hashlib
import importlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

# Bump when anything below changes the produced files.
RECIPE_VERSION = "2"
VERSION_FILE = ".kvpilot-model-version"

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
SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
BOS, EOS_TEXT, IM_START, IM_END, PAD = SPECIAL_TOKENS

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

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


def _corpus() -> list[str]:
    """A fixed pseudo-random text corpus (a linear congruential generator keeps it stable)."""
    state = 12345
    lines: list[str] = []
    for _ in range(600):
        words: list[str] = []
        for _ in range(12):
            state = (1103515245 * state + 12345) % (2**31)
            words.append(_WORDS[state % len(_WORDS)])
        state = (1103515245 * state + 12345) % (2**31)
        words.append(str(state % 10000))
        lines.append(" ".join(words).capitalize() + ".")
    return lines


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


def _train_tokenizer() -> Any:
    # Single-threaded training keeps the merge order stable.
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    # Imported here: only the SGLang venv has `tokenizers`; this file is also type-checked and
    # imported (for default_dir) from the main venv.
    tk = importlib.import_module("tokenizers")
    decoders, models, pre_tokenizers = tk.decoders, tk.models, tk.pre_tokenizers
    processors, trainers = tk.processors, tk.trainers

    tok = tk.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok


def build(out_dir: Path) -> Path:
    """Write the model directory to ``out_dir`` (atomically) unless it is already current."""
    out_dir = out_dir.resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    lock_path = out_dir.parent / f".{out_dir.name}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # concurrent launches build once
        if is_current(out_dir):
            return out_dir
        _build_unlocked(out_dir)
    return out_dir


def is_current(out_dir: Path) -> bool:
    marker = out_dir / VERSION_FILE
    return marker.is_file() and marker.read_text().strip() == RECIPE_VERSION


def _build_unlocked(out_dir: Path) -> None:
    tok = _train_tokenizer()
    vocab = tok.get_vocab()
    bos_id, eos_id = vocab[BOS], vocab[IM_END]
    # " token" in byte-level BPE spelling; generated text reads " token token token ...".
    sample_id = vocab.get("\u0120token", vocab["t"])

    tmp = Path(tempfile.mkdtemp(prefix=".kvpilot-model-", dir=out_dir.parent))
    try:
        tok.save(str(tmp / "tokenizer.json"))
        (tmp / "config.json").write_text(
            json.dumps(_model_config(VOCAB_SIZE, bos_id, eos_id, sample_id), indent=2) + "\n"
        )
        tokenizer_config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": CONTEXT_LENGTH,
            "bos_token": BOS,
            "eos_token": IM_END,
            "pad_token": PAD,
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        }
        (tmp / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
        (tmp / "special_tokens_map.json").write_text(
            json.dumps({"bos_token": BOS, "eos_token": IM_END, "pad_token": PAD}, indent=2) + "\n"
        )
        (tmp / "generation_config.json").write_text(
            json.dumps({"bos_token_id": bos_id, "eos_token_id": eos_id}, indent=2) + "\n"
        )
        (tmp / VERSION_FILE).write_text(RECIPE_VERSION + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def digest(model_dir: Path) -> str:
    """SHA-256 over the files of a model directory (used to check determinism)."""
    h = hashlib.sha256()
    for path in sorted(p for p in model_dir.iterdir() if p.is_file()):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def default_dir() -> Path:
    venv = os.environ.get("KVPILOT_SGLANG_VENV") or str(
        Path(__file__).resolve().parents[2] / ".venv-sglang"
    )
    return Path(venv) / "kvpilot-model"


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else default_dir()
    path = build(out)
    print(f"{path} sha256={digest(path)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
