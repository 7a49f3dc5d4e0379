"""The experiment: its state machine, its outcome, who carries it, restart limits."""
