"""Statistics without SciPy: t quantiles, intervals, batch means."""
