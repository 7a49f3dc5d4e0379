"""`python -m sim.vllm serve MODEL [flags]` (also `python -m sim.launch_server --engine vllm`)."""

import sys

from sim.vllm.launch import main

sys.exit(main())
