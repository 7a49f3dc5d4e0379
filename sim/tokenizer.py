"""A deterministic stand-in tokenizer so text requests have stable token ids.

Words of a fixed 1,024-word vocabulary map to ids 1000..2023 and back, so text the twin generates
re-tokenizes to the same ids (multi-turn prompts then hit the prefix cache as they would on a real
server). Other words map to stable hashed ids, and long words are split into 4-character pieces,
so token counts grow with text length roughly like a BPE tokenizer's.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable

_SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ne",
    "ru",
    "sa",
    "ti",
    "vo",
    "da",
    "pe",
    "ro",
    "la",
    "mu",
    "ni",
    "so",
    "te",
    "be",
    "go",
    "fa",
    "zi",
    "wa",
    "qu",
    "xe",
    "ho",
    "ju",
    "ye",
    "ci",
    "du",
    "po",
    "ma",
    "re",
    "li",
]
VOCAB_OFFSET = 1000
WORDS = [a + b for a in _SYLLABLES for b in _SYLLABLES]  # 1,024 two-syllable words
_WORD_IDS = {w: VOCAB_OFFSET + i for i, w in enumerate(WORDS)}
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")
HASH_BASE, HASH_RANGE = 3000, 100_000


def encode(text: str) -> list[int]:
    ids: list[int] = []
    for piece in _TOKEN_RE.findall(text):
        known = _WORD_IDS.get(piece)
        if known is not None:
            ids.append(known)
            continue
        for i in range(0, len(piece), 4):
            part = piece[i : i + 4]
            ids.append(HASH_BASE + zlib.crc32(part.encode()) % HASH_RANGE)
    return ids


def decode(ids: Iterable[int]) -> str:
    words = []
    for i in ids:
        j = i - VOCAB_OFFSET
        words.append(WORDS[j] if 0 <= j < len(WORDS) else f"t{i}")
    return " ".join(words)


def apply_chat_template(messages: list[dict[str, object]]) -> str:
    """ChatML, as most instruct models' templates render (the prefix of a turn never changes)."""
    parts = []
    for m in messages:
        content = m.get("content", "")
        if isinstance(content, list):  # OpenAI content parts
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"<|im_start|>{m.get('role', 'user')}\n{content}<|im_end|>\n")
    parts.append("<|im_start|>assistant\n")
    return "".join(parts)
