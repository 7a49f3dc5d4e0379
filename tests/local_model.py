"""A small model directory made here, offline and deterministically, for the harnesses that run
a real engine on CPU (`tests/real_sglang/`, `tests/real_vllm/`).

Each harness's `make_model.py` says what its model is (config.json, weights or none, the
tokenizer's size and corpus); this module does what they share: a pseudo-random corpus, a
byte-level BPE tokenizer trained on it with ChatML special tokens, the tokenizer files both
engines read, and an atomic, locked build that a second run with the same recipe skips.
Standard library only at import: `tokenizers` is imported when a tokenizer is trained, since
only the engines' environments have it, while the main environment imports the harnesses for
their paths and type-checks them.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VERSION_FILE = ".kvpilot-model-version"
SPECIAL_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>", "<|pad|>")
BOS, EOS_TEXT, IM_START, IM_END, PAD = SPECIAL_TOKENS
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class Corpus:
    """Lines of `per_line` words drawn from `words`, each ending in a number below `modulo`; a
    linear congruential generator from `seed` keeps the text, and so the merges, stable."""

    words: Sequence[str]
    seed: int
    lines: int
    per_line: int
    modulo: int

    def text(self) -> list[str]:
        state = self.seed
        out: list[str] = []
        for _ in range(self.lines):
            line: list[str] = []
            for _ in range(self.per_line):
                state = (1103515245 * state + 12345) % (2**31)
                line.append(self.words[state % len(self.words)])
            state = (1103515245 * state + 12345) % (2**31)
            line.append(str(state % self.modulo))
            out.append(" ".join(line).capitalize() + ".")
        return out


def train_tokenizer(corpus: Corpus, vocab_size: int) -> Any:
    """A byte-level BPE tokenizer (the `tokenizers` library) with the ChatML special tokens."""
    # Single-threaded training keeps the merge order stable.
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    tk = importlib.import_module("tokenizers")
    decoders, models, pre_tokenizers = tk.decoders, tk.models, tk.pre_tokenizers
    processors, trainers = tk.processors, tk.trainers

    tok = tk.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus.text(), trainer=trainer)
    return tok


# A filler token's spelling: the byte-level "Ġ" (a space) and "#" then a number, all characters
# of the byte-level alphabet, so each decodes to text (" #128000"); none occurs in the corpus.
FILLER = "\u0120#{}"


def pad_vocabulary(tok: Any, entries: int) -> Any:
    """`tok` with its BPE vocabulary filled up to exactly `entries` ids.

    A model's sampled ids can be any id below its vocab size; with random weights they are, and
    a tokenizer that lacks an id cannot decode it. The fillers have no merges, so encoding text
    never produces them; they only make every id decode.
    """
    data = json.loads(tok.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    added = {t["content"]: t["id"] for t in data.get("added_tokens", [])}
    size = max([*vocab.values(), *added.values()]) + 1
    if size > entries:
        raise ValueError(f"the tokenizer already has {size} entries, more than {entries}")
    for token_id in range(size, entries):
        vocab[FILLER.format(token_id)] = token_id
    padded = type(tok).from_str(json.dumps(data))
    if padded.get_vocab_size(with_added_tokens=True) != entries:
        raise AssertionError(f"padding gave {padded.get_vocab_size()} entries, not {entries}")
    return padded


def write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def write_tokenizer(folder: Path, tok: Any, max_length: int, generation: dict[str, Any]) -> None:
    """tokenizer.json, its config with the chat template, the special tokens, and the
    generation config (`generation`: the token ids the model's config names)."""
    tok.save(str(folder / "tokenizer.json"))
    write_json(
        folder / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": max_length,
            "bos_token": BOS,
            "eos_token": IM_END,
            "pad_token": PAD,
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    write_json(
        folder / "special_tokens_map.json",
        {"bos_token": BOS, "eos_token": IM_END, "pad_token": PAD},
    )
    write_json(folder / "generation_config.json", generation)


def build(out_dir: Path, recipe: str, write: Callable[[Path], None]) -> Path:
    """`write(folder)` into a fresh folder that then replaces `out_dir`, unless `out_dir` was
    already built by this `recipe` version; concurrent launches build once (a file lock)."""
    out_dir = out_dir.resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.parent / f".{out_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_current(out_dir, recipe):
            return out_dir
        tmp = Path(tempfile.mkdtemp(prefix=".kvpilot-model-", dir=out_dir.parent))
        try:
            write(tmp)
            (tmp / VERSION_FILE).write_text(recipe + "\n")
            # mkdtemp makes the folder 0700 (and safetensors writes 0600): make them readable.
            tmp.chmod(0o755)
            for f in tmp.iterdir():
                f.chmod(0o644)
            if out_dir.exists():
                shutil.rmtree(out_dir)
            tmp.rename(out_dir)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
    return out_dir


def is_current(out_dir: Path, recipe: str) -> bool:
    marker = out_dir / VERSION_FILE
    return marker.is_file() and marker.read_text().strip() == recipe


def digest(model_dir: Path) -> str:
    """SHA-256 over the files of a model directory (used to check determinism)."""
    h = hashlib.sha256()
    for path in sorted(p for p in model_dir.iterdir() if p.is_file()):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def venv_dir(variable: str, default_name: str) -> Path:
    """A harness's environment: `$variable`, else `<repo>/<default_name>`."""
    return Path(os.environ.get(variable) or Path(__file__).resolve().parents[1] / default_name)
