"""Stand-in: the two names `sglang/srt/layers/sampler.py` imports on CUDA."""

from __future__ import annotations

from flashinfer import missing

min_p_sampling_from_probs = missing("sampling.min_p_sampling_from_probs")
top_k_top_p_sampling_from_probs = missing("sampling.top_k_top_p_sampling_from_probs")
