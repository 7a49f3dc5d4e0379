"""The vLLM twin: `vllm serve` in simulated time, beside the SGLang twin.

It shares the engine-neutral parts of `sim/` (the scaled clock and request delivery of
`sim.runtime`, the model shapes of `sim.models`, the presets' memory and step models, the request
stand-ins of `sim.request`, the tokenizer and the workload profiles) and adds vLLM's own flags,
KV sizing, v1 scheduler, HTTP API, metrics and log lines.
"""
