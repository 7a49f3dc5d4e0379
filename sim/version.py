"""SGLang API dialects.

The twin speaks the HTTP API, metric names and log formats of a chosen SGLang release. Behaviour
changes at a few releases that were read from SGLang's own source (see README):

* 0.5.5  — legacy endpoint names (`/get_server_info`, `/get_model_info`, `/get_load`).
* 0.5.10 — `/server_info`, `/model_info`, `/v1/loads`; old names kept as deprecated aliases;
  capacity gauges (`sglang:max_total_num_tokens`, HiCache host gauges); log lines end with
  `cuda graph: ..., input throughput ...`.
* 0.5.23 — `/get_load` removed, `/ready` added, KV gauges (`sglang:kv_used_tokens` ...), the
  per-rank host-memory check for the hierarchical cache, `#pending-token` in prefill lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import total_ordering

SUPPORTED_FLOOR = (0, 5, 5)


@total_ordering
@dataclass(frozen=True)
class SGLangVersion:
    """A release number such as 0.5.10 (post-release suffixes are kept for display only)."""

    major: int
    minor: int
    patch: int
    text: str

    @classmethod
    def parse(cls, text: str) -> SGLangVersion:
        """Parse `0.5.10`, `0.5.10.post1` or `v0.5.23`; raise ValueError with a usable message."""
        raw = text.strip().lstrip("v")
        parts = raw.split(".")
        if len(parts) < 3:
            raise ValueError(f"invalid SGLang version {text!r}: expected MAJOR.MINOR.PATCH")
        try:
            major, minor, patch = (int(p) for p in parts[:3])
        except ValueError:
            raise ValueError(
                f"invalid SGLang version {text!r}: expected numbers like 0.5.10"
            ) from None
        if (major, minor, patch) < SUPPORTED_FLOOR:
            raise ValueError(
                f"SGLang version {text!r} is older than the oldest dialect the twin speaks (0.5.5)"
            )
        return cls(major, minor, patch, raw)

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.major, self.minor, self.patch)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, SGLangVersion):
            return NotImplemented
        return self.key < other.key

    def at_least(self, text: str) -> bool:
        return self.key >= SGLangVersion.parse(text).key

    @property
    def new_endpoints(self) -> bool:
        """`/server_info`, `/model_info` and `/v1/loads` exist (0.5.10 and later)."""
        return self.at_least("0.5.10")

    @property
    def refactored(self) -> bool:
        """The 0.5.23 refactor: `/ready`, no `/get_load`, per-rank HiCache host check."""
        return self.at_least("0.5.23")

    def __str__(self) -> str:
        return self.text


DEFAULT_VERSION = "0.5.10"
