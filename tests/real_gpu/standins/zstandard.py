"""Stand-in for zstandard: imported for zstd-compressed request bodies, which nobody sends."""

from __future__ import annotations


class ZstdError(Exception):
    """The error zstandard raises."""


class ZstdDecompressor:
    def __init__(self, *args: object, **kwargs: object) -> None:
        raise ZstdError("zstandard is not in the GPU bundle: send request bodies uncompressed")
