"""Stand-in for IPython: `sglang.utils` imports `IPython.display` for notebook output."""
