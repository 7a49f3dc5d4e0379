"""Stand-in for soundfile: imported by SGLang's audio endpoints' modules, unused on text."""

from __future__ import annotations

from typing import NoReturn


class LibsndfileError(RuntimeError):
    """The error soundfile raises; SGLang's audio code names it in an `except` clause."""


def _absent(*args: object, **kwargs: object) -> NoReturn:
    raise LibsndfileError("soundfile is not in the GPU bundle: audio input is not supported")


read = _absent
write = _absent
