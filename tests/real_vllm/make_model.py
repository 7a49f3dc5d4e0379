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

import importlib
import sys
from pathlib import Path
from typing import Any

if not __package__:  # run as a script, by the vLLM environment's python
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests import local_model
from tests.local_model import BOS, IM_END, PAD

# Bump when anything below changes the produced files.
RECIPE_VERSION = "1"
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


# A fixed pseudo-random text corpus for the tokenizer.
CORPUS = local_model.Corpus(_WORDS, seed=424242, lines=2000, per_line=14, modulo=100000)


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


def _write(folder: Path) -> None:
    save_file = importlib.import_module("safetensors.torch").save_file
    tok = local_model.train_tokenizer(CORPUS, TOKENIZER_VOCAB)
    vocab = tok.get_vocab()
    vocab_size = tok.get_vocab_size()
    bos_id, eos_id, pad_id = vocab[BOS], vocab[IM_END], vocab[PAD]
    local_model.write_json(
        folder / "config.json", _model_config(vocab_size, bos_id, eos_id, pad_id)
    )
    local_model.write_tokenizer(
        folder,
        tok,
        MAX_POSITIONS,
        {"bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": pad_id},
    )
    save_file(_weights(vocab_size), str(folder / "model.safetensors"), metadata={"format": "pt"})


def build(out_dir: Path) -> Path:
    """Write the model directory to ``out_dir`` (atomically) unless it is already current."""
    return local_model.build(out_dir, RECIPE_VERSION, _write)


def default_dir() -> Path:
    return local_model.venv_dir("KVPILOT_VLLM_VENV", ".venv-vllm") / "kvpilot-model"


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else default_dir()
    path = build(out)
    print(f"{path} sha256={local_model.digest(path)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
