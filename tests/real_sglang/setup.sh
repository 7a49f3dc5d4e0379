#!/usr/bin/env bash
# Install the real-SGLang conformance environment: a separate venv with sglang 0.5.23 on a CPU
# torch, plus the weightless model directory. Idempotent: when requirements.txt, this script and
# the Python version are unchanged since the last successful run, it exits at once.
#
#   tests/real_sglang/setup.sh            # install or update
#   tests/real_sglang/setup.sh --rebuild  # delete the venv first
#
# Environment: KVPILOT_SGLANG_VENV (default <repo>/.venv-sglang), PYTHON (default python3,
# must be 3.11). Uses pip, never uv: pip's configuration on the build machines points at the
# local CPU torch wheel. Every install is --no-deps, so only the pinned set in requirements.txt is
# installed; CUDA packages (sgl-kernel/sglang-kernel, flashinfer, torchvision, nvidia-*) never are.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${KVPILOT_SGLANG_VENV:-$REPO/.venv-sglang}"
REQ="$REPO/tests/real_sglang/requirements.txt"
STAMP="$VENV/.kvpilot-sglang-installed"
ENGINE_PIN=sglang
# shellcheck source=tests/real_env.sh
source "$REPO/tests/real_env.sh"

real_env_begin "$@"
real_env_install
real_env_refuse '^(sgl[-_]kernel|sglang[-_]kernel|flashinfer|flash[-_]attn|torchvision|torchaudio|nvidia[-_]|cuda[-_])' \
    "CUDA-side packages"
real_env_check_pins
"$VENV/bin/python" - <<'EOF'
import torch, transformers, tokenizers, sglang.version
assert torch.__version__.endswith("+cpu"), f"torch is {torch.__version__}, expected a +cpu build"
assert not torch.cuda.is_available()
print(f"torch {torch.__version__}, sglang {sglang.version.__version__}, "
      f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}")
EOF

real_env_finish "${KVPILOT_SGLANG_MODEL_DIR:-$VENV/kvpilot-model}"
