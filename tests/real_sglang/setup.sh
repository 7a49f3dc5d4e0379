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

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VENV="${KVPILOT_SGLANG_VENV:-$REPO/.venv-sglang}"
PYTHON="${PYTHON:-python3}"
REQ="$HERE/requirements.txt"
STAMP="$VENV/.kvpilot-sglang-installed"
T0=$(date +%s)

say() { printf '[setup %4ss] %s\n' "$(($(date +%s) - T0))" "$*"; }

if [[ "${1:-}" == "--rebuild" ]]; then
    say "removing $VENV"
    rm -rf "$VENV"
fi

pyver="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [[ "$pyver" != "3.11" ]]; then
    echo "setup.sh: need Python 3.11 (sglang wheel and torch wheel are cp311), got $pyver" >&2
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
sglang_pin="$(grep -E '^sglang==' "$REQ")"

say "installing $torch_pin"
pip_install "$torch_pin"
say "installing $sglang_pin (no dependencies)"
pip_install "$sglang_pin"
say "installing the pinned CPU-side dependencies"
grep -vE '^(torch|sglang)==' "$REQ" > "$VENV/.kvpilot-deps.txt"
pip_install -r "$VENV/.kvpilot-deps.txt"

say "checking the environment"
forbidden="$("${PIP[@]}" list --format=freeze 2>/dev/null |
    grep -iE '^(sgl[-_]kernel|sglang[-_]kernel|flashinfer|flash[-_]attn|torchvision|torchaudio|nvidia[-_]|cuda[-_])' || true)"
if [[ -n "$forbidden" ]]; then
    echo "setup.sh: CUDA-side packages found in $VENV (remove them or use --rebuild):" >&2
    echo "$forbidden" >&2
    exit 1
fi
"$VENV/bin/python" - <<'EOF'
import torch, transformers, tokenizers, sglang.version
assert torch.__version__.endswith("+cpu"), f"torch is {torch.__version__}, expected a +cpu build"
assert not torch.cuda.is_available()
print(f"torch {torch.__version__}, sglang {sglang.version.__version__}, "
      f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}")
EOF

say "building the model directory"
"$VENV/bin/python" "$HERE/make_model.py" "${KVPILOT_SGLANG_MODEL_DIR:-$VENV/kvpilot-model}"

echo "$want" > "$STAMP"
say "done: $VENV ($(du -sh "$VENV" | cut -f1))"
