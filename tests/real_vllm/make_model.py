"""Build the tiny random Llama model directory the real-vLLM conformance server loads.

Everything is made here, offline, from fixed seeds: a byte-level BPE tokenizer trained with the
``tokenizers`` library on a generated corpus, a ``config.json`` for a 4-layer Llama, and random
bf16 weights written with ``safetensors``. Nothing comes from a model hub.

Run it with the vLLM venv's python (it needs ``torch``, ``safetensors`` and ``tokenizers``)::

    .venv-vllm/bin/python tests/real_vllm/make_model.py [OUT_DIR]

It prints ``<dir> sha256=<digest over the files>``. The output is deterministic for the pinned
package set; a file ``.kvpilot-model-version`` records the recipe version and a second run with
the same version is a no-op.

Shape and why:

* ``head_dim`` 64: a size vLLM's CPU attention backend supports (``CPUAttentionBackend``
  ``get_supported_head_sizes`` = 32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512;
  ``vllm/v1/attention/backends/cpu_attn.py:69-70``).
* 4 layers, 4 query heads, 2 KV heads (GQA), bf16: the KV cache takes
  ``2 (K and V) x 4 layers x 2 KV heads x 64 x 2 bytes = 2048 bytes per token``
  (``AttentionSpec.page_size_bytes`` per layer, ``vllm/v1/kv_cache_interface.py:541-560``);
  a CPU block holds 128 tokens (``vllm/platforms/cpu.py:293``), so one block is 256 KiB and
  ``--kv-cache-memory-bytes 64M`` gives 256 blocks.
* The layer count differs from the KV-head count so that a per-token figure identifies both.
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
RECIPE_VERSION = "1"
VERSION_FILE = ".kvpilot-model-version"
WEIGHTS_SEED = 20260101
INIT_STD = 0.02

NUM_LAYERS = 4
NUM_HEADS = 4
NUM_KV_HEADS = 2
HEAD_DIM = 64
HIDDEN = 128
INTERMEDIATE = 256
MAX_POSITIONS = 4096
ROPE_THETA = 10000.0
RMS_EPS = 1e-5

TOKENIZER_VOCAB = 1024
SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
BOS, EOS_TEXT, IM_START, IM_END, PAD = SPECIAL_TOKENS

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_WORDS_TEXT = (
    "the a an of to in for on with by is are was be as at from this that it its and or not "
    "server request requests token tokens cache prefix block blocks memory pool batch decode "
    "prefill latency throughput queue running waiting preempted model weights layer layers head "
    "heads page size cpu host device fraction utilization total max min time first output input "
    "chat user assistant system hello world please tell me about how what when why which number "
    "value tune tuning restart metric metrics health ready load info usage capacity context "
    "engine worker scheduler sequence sequences budget chunk chunked eager graph kernel thread "
    "core cores node swap offload hit miss rate step steps seconds bytes"
)
_WORDS = _WORDS_TEXT.split()


def _corpus() -> list[str]:
    """A fixed pseudo-random text corpus (a linear congruential generator keeps it stable)."""
    state = 424242
    lines: list[str] = []
    for _ in range(2000):
        words: list[str] = []
        for _ in range(14):
            state = (1103515245 * state + 12345) % (2**31)
            words.append(_WORDS[state % len(_WORDS)])
        state = (1103515245 * state + 12345) % (2**31)
        words.append(str(state % 100000))
        lines.append(" ".join(words).capitalize() + ".")
    return lines


def _train_tokenizer() -> Any:
    # Single-threaded training keeps the merge order stable.
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    # Imported here so this file can be imported (for default_dir) without `tokenizers`.
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


def _model_config(vocab_size: int, bos_id: int, eos_id: int, pad_id: int) -> dict[str, Any]:
    # Keys as transformers 5.19's LlamaConfig writes them (`rope_parameters`, `dtype`).
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
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": RMS_EPS,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "vocab_size": vocab_size,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "use_cache": True,
        "kvpilot_note": "tiny random Llama for the real-vLLM CPU conformance tier; untrained",
    }


def _weights(vocab_size: int) -> dict[str, Any]:
    """Random bf16 tensors under the Hugging Face Llama parameter names vLLM's loader maps."""
    torch = importlib.import_module("torch")
    gen = torch.Generator().manual_seed(WEIGHTS_SEED)

    def normal(*shape: int) -> Any:
        t = torch.randn(*shape, generator=gen, dtype=torch.float32) * INIT_STD
        return t.to(torch.bfloat16).contiguous()

    def ones(n: int) -> Any:
        return torch.ones(n, dtype=torch.bfloat16)

    q_out, kv_out = NUM_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM
    tensors: dict[str, Any] = {"model.embed_tokens.weight": normal(vocab_size, HIDDEN)}
    for i in range(NUM_LAYERS):
        p = f"model.layers.{i}."
        tensors[p + "self_attn.q_proj.weight"] = normal(q_out, HIDDEN)
        tensors[p + "self_attn.k_proj.weight"] = normal(kv_out, HIDDEN)
        tensors[p + "self_attn.v_proj.weight"] = normal(kv_out, HIDDEN)
        tensors[p + "self_attn.o_proj.weight"] = normal(HIDDEN, q_out)
        tensors[p + "mlp.gate_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        tensors[p + "mlp.up_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        tensors[p + "mlp.down_proj.weight"] = normal(HIDDEN, INTERMEDIATE)
        tensors[p + "input_layernorm.weight"] = ones(HIDDEN)
        tensors[p + "post_attention_layernorm.weight"] = ones(HIDDEN)
    tensors["model.norm.weight"] = ones(HIDDEN)
    tensors["lm_head.weight"] = normal(vocab_size, HIDDEN)
    return tensors


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
    save_file = importlib.import_module("safetensors.torch").save_file
    tok = _train_tokenizer()
    vocab = tok.get_vocab()
    vocab_size = tok.get_vocab_size()
    bos_id, eos_id, pad_id = vocab[BOS], vocab[IM_END], vocab[PAD]

    tmp = Path(tempfile.mkdtemp(prefix=".kvpilot-model-", dir=out_dir.parent))
    try:
        tok.save(str(tmp / "tokenizer.json"))
        (tmp / "config.json").write_text(
            json.dumps(_model_config(vocab_size, bos_id, eos_id, pad_id), indent=2) + "\n"
        )
        tokenizer_config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": MAX_POSITIONS,
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
            json.dumps(
                {"bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": pad_id}, indent=2
            )
            + "\n"
        )
        save_file(_weights(vocab_size), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / VERSION_FILE).write_text(RECIPE_VERSION + "\n")
        # mkdtemp makes the folder 0700 and safetensors writes 0600; make them readable.
        tmp.chmod(0o755)
        for f in tmp.iterdir():
            f.chmod(0o644)
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
    venv = os.environ.get("KVPILOT_VLLM_VENV") or str(
        Path(__file__).resolve().parents[2] / ".venv-vllm"
    )
    return Path(venv) / "kvpilot-model"


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else default_dir()
    path = build(out)
    print(f"{path} sha256={digest(path)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
