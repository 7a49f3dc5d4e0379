"""Stand-in: the one name `sglang/srt/layers/attention/vision.py` imports on CUDA."""

from __future__ import annotations

from flashinfer import missing

cudnn_batch_prefill_with_kv_cache = missing("prefill.cudnn_batch_prefill_with_kv_cache")
