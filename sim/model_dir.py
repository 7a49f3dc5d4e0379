"""`python -m sim.model_dir PRESET DIR`: a model directory for a vLLM preset's model.

Writes DIR/config.json as the model's repository publishes it (no weights: the twin needs
none), so a twin served with `serve DIR` is read by kvpilot as a real server's model directory
on the GPU host is. Front ends that start a twin (`make demo ENGINE=vllm`) call it as a command,
as they start the twin, so the product never imports the twin.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sim.models import write_model_dir
from sim.vllm.presets import VLLM_PRESETS, get_vllm_preset


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sim.model_dir", description=__doc__.split("\n")[0])
    p.add_argument("preset", help=f"a vLLM preset: {', '.join(sorted(VLLM_PRESETS))}")
    p.add_argument("dir", type=Path)
    ns = p.parse_args(argv)
    try:
        preset = get_vllm_preset(ns.preset)
    except ValueError as exc:
        p.error(str(exc))
    print(write_model_dir(preset.model, ns.dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
