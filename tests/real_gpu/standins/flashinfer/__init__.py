"""Stand-in for flashinfer: only the names SGLang 0.5.17 imports on CUDA without checking
whether flashinfer is available (`SGLANG_IS_FLASHINFER_AVAILABLE=false` covers the rest).

`sglang/srt/layers/quantization/fp8_utils.py` imports `bmm_fp8` (FP8 only), `sampler.py` two
names from `flashinfer.sampling`, `attention/vision.py` one from `flashinfer.prefill`. Every
other submodule is absent, so `import flashinfer.norm` raises ImportError as without flashinfer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn


def missing(name: str) -> Callable[..., NoReturn]:
    """A function that says, when called, that flashinfer's `name` is not here."""

    def call(*args: object, **kwargs: object) -> NoReturn:
        raise RuntimeError(
            f"flashinfer.{name} was called, but this is the GPU bundle's stand-in for "
            "flashinfer, which answers only the names SGLang imports: use backends that do "
            "not need flashinfer (--attention-backend triton --sampling-backend pytorch)"
        )

    call.__name__ = name.rsplit(".", 1)[-1]
    call.__qualname__ = call.__name__
    return call


bmm_fp8 = missing("bmm_fp8")
