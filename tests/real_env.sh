# Shared by tests/real_sglang/setup.sh and tests/real_vllm/setup.sh (sourced, not run): a
# separate venv for a real engine on CPU, installed from an exact pinned list, every
# package --no-deps, and a stamp so that an unchanged setup exits at once.
#
# The caller sets VENV, REQ (its requirements.txt), STAMP and ENGINE_PIN (the engine's
# distribution name in REQ), then calls, in order:
#   real_env_begin "$@"          --rebuild, the Python 3.11 check, the stamp check, the venv
#   real_env_install             torch, then the engine, then the rest of REQ
#   real_env_refuse REGEX WHAT   fails when a package matching REGEX (pip freeze lines) is there
#   real_env_check_pins          fails when a pinned package is missing or at another version
#   real_env_finish MODEL_DIR    builds the model directory with the harness's make_model.py
# Installs with uv where the project venv has it (`make venv`), else with pip; either way pip's
# configuration on the build machines (find-links to the local CPU torch wheel, constraints)
# applies.

T0=$(date +%s)
PYTHON="${PYTHON:-python3}"
HERE="$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)"

say() { printf '[setup %4ss] %s\n' "$(($(date +%s) - T0))" "$*"; }

real_env_begin() {
    # One setup of a venv at a time: a second (`make test` while .ci/run's early one still
    # installs) waits for the first, then finds the stamp and exits.
    exec 9>"$VENV.lock"
    flock 9
    if [[ "${1:-}" == "--rebuild" ]]; then
        say "removing $VENV"
        rm -rf "$VENV"
    fi
    local pyver
    pyver="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    if [[ "$pyver" != "3.11" ]]; then
        echo "setup.sh: need Python 3.11 (the engine's and torch's wheels are cp311), got $pyver" >&2
        exit 2
    fi
    # The stamp covers the pins, the caller's script, this library and the Python version.
    WANT="$( { cat "$REQ" "$0" "${BASH_SOURCE[0]}"; echo "python=$pyver"; } | sha256sum | cut -d' ' -f1)"
    if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
        say "up to date: $VENV"
        exit 0
    fi
    if [[ ! -x "$VENV/bin/python" ]]; then
        say "creating venv $VENV"
        "$PYTHON" -m venv "$VENV"
    fi
    PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
    rm -f "$STAMP"
}

# pip warns once per package about configured local index folders that do not exist; drop that.
pip_install() {
    "${PIP[@]}" install --quiet --no-deps "$@" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
}

# uv, where the project's venv has it (a dev dependency): the same exact pins, --no-deps, with
# pip's own find-links (the local CPU torch wheel) and constraints passed on, in about 15 s where
# pip takes about 160 s for vLLM's set. KVPILOT_REAL_ENV_PIP=1 installs with pip instead.
UV="${KVPILOT_UV:-$REPO/.venv/bin/uv}"

uv_install() {
    # --compile-bytecode, as pip does: the engines start their workers with `python -B`, which
    # would otherwise compile torch, transformers and the engine from source at every start
    local args=(pip install --quiet --no-deps --compile-bytecode --python "$VENV/bin/python")
    local entry
    for entry in $("${PIP[@]}" config get global.find-links 2>/dev/null || true); do
        [[ -d "$entry" ]] && args+=(--find-links "$entry")
    done
    for entry in $("${PIP[@]}" config get global.constraint 2>/dev/null || true); do
        [[ -f "$entry" ]] && args+=(--constraint "$entry")
    done
    UV_LINK_MODE=copy "$UV" "${args[@]}" "$@"
}

real_env_install() {
    local torch_pin engine_pin
    if [[ -x "$UV" && "${KVPILOT_REAL_ENV_PIP:-0}" != 1 ]]; then
        say "installing every pin of $(basename "$REQ") with uv (no dependencies)"
        uv_install -r "$REQ"
        say "checking the environment"
        INSTALLED="$("${PIP[@]}" list --format=freeze 2>/dev/null)"
        return
    fi
    torch_pin="$(grep -E '^torch==' "$REQ")"
    engine_pin="$(grep -E "^${ENGINE_PIN}==" "$REQ")"
    say "installing $torch_pin"
    pip_install "$torch_pin"
    say "installing $engine_pin (no dependencies)"
    pip_install "$engine_pin"
    say "installing the pinned CPU-side dependencies"
    grep -vE "^(torch|${ENGINE_PIN})==" "$REQ" > "$VENV/.kvpilot-deps.txt"
    pip_install -r "$VENV/.kvpilot-deps.txt"
    say "checking the environment"
    INSTALLED="$("${PIP[@]}" list --format=freeze 2>/dev/null)"
}

real_env_refuse() {
    local found
    found="$(grep -iE "$1" <<<"$INSTALLED" || true)"
    if [[ -n "$found" ]]; then
        echo "setup.sh: $2 found in $VENV (remove them or use --rebuild):" >&2
        echo "$found" >&2
        exit 1
    fi
}

real_env_check_pins() {
    # Everything pinned is installed at the pinned version (pip spells some names differently).
    printf '%s\n' "$INSTALLED" > "$VENV/.kvpilot-freeze.txt"
    local missing
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
}

real_env_finish() {
    say "building the model directory"
    "$VENV/bin/python" "$HERE/make_model.py" "$1"
    echo "$WANT" > "$STAMP"
    say "done: $VENV ($(du -sh "$VENV" | cut -f1))"
}
