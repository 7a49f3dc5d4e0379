#!/usr/bin/env bash
# The Debian packages the tiers meet for real: Prometheus (tests/playbooks/sources/prometheus),
# and for the launchers' real daemons and kvpilot's image, dockerd, sshd, ssh-keygen and
# debootstrap (tests/real_daemons).
#
#   tests/debs.sh install   # install what is missing (root, apt), holding the lock while it runs
#   tests/debs.sh wait      # wait for an install under way; fail if it failed
#
# `.ci/run` starts `install` in the background, beside the project's own install and
# lint and types, which need none of them; the targets that do need them (Makefile: debs-ready)
# run `wait`, which returns at once where no install was started.
set -euo pipefail

DIR="${KVPILOT_DEBS_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
LOCK="$DIR/.debs.lock"
STATUS="$DIR/.debs.status"  # the install's outcome: "ok" or "failed: <log>"
LOG="$DIR/.debs.log"

missing() {
    command -v prometheus >/dev/null || echo prometheus
    command -v dockerd >/dev/null || echo docker.io
    command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || echo openssh-server
    command -v ssh-keygen >/dev/null || echo openssh-client
    command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || echo debootstrap
}

install() {
    if [ "${KVPILOT_DEBS_LOCKED:-}" != 1 ]; then  # else the caller took it, on fd 9, before starting this
        exec 9>"$LOCK"
        flock 9
    fi
    rm -f "$STATUS"
    mapfile -t packages < <(missing)
    if [ "${#packages[@]}" -eq 0 ]; then
        echo ok > "$STATUS"
        return
    fi
    echo "installing ${packages[*]}"
    # fd 9 (the lock) closed for apt: a daemon a package's script starts must not hold it on
    if { apt-get update && apt-get install -y --no-install-recommends "${packages[@]}"; } \
        >"$LOG" 2>&1 9>&-; then
        echo ok > "$STATUS"
    else
        echo "failed: $LOG" > "$STATUS"
        tail -n 20 "$LOG" >&2
        exit 1
    fi
}

wait_for_install() {
    [ -e "$LOCK" ] || return 0  # none was started here
    exec 9>>"$LOCK"
    flock 9
    if [ -e "$STATUS" ] && [ "$(cat "$STATUS")" != ok ]; then
        echo "tests/debs.sh: the Debian packages' install $(cat "$STATUS");" \
            "run 'tests/debs.sh install' as root to see why" >&2
        exit 1
    fi
}

case "${1:-}" in
    install) install ;;
    wait) wait_for_install ;;
    *)
        echo "usage: tests/debs.sh install|wait" >&2
        exit 2
        ;;
esac
