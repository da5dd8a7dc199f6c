#!/usr/bin/env bash
# Mount rnixfs with the embedded model, spawn one agent process through
# proc/new, wait for it, show its result, trace and status, the daemon's
# status (sandbox mode included), then unmount.
#
#   bash scripts/demo.sh [MOUNTPOINT]
#
# MOUNTPOINT defaults to a new temporary directory. Needs no stdin.
# Environment: RNIXFS_BIN (default: this repo's .venv/bin/rnixfs),
#              DEMO_QUESTION, DEMO_TIMEOUT (seconds, default 300).
set -euo pipefail
exec </dev/null

cd "$(dirname "${BASH_SOURCE[0]}")/.."
rnixfs=${RNIXFS_BIN:-$(pwd)/.venv/bin/rnixfs}
question=${DEMO_QUESTION:-What is the capital of France?}
limit=${DEMO_TIMEOUT:-300}

[ -x "$rnixfs" ] || { echo "demo.sh: $rnixfs not found; run: bash scripts/setup.sh" >&2; exit 1; }

made_dir=
if [ $# -ge 1 ]; then
    M=$1
    mkdir -p "$M"
else
    M=$(mktemp -d "${TMPDIR:-/tmp}/rnixfs-demo.XXXXXX")
    made_dir=1
fi
M=$(cd "$M" && pwd)

mounted=
cleanup() {
    local rc=$?
    exec 3>&- 2>/dev/null || true
    if [ -n "$mounted" ]; then
        echo
        echo "\$ rnixfs umount $M"
        "$rnixfs" umount "$M" || rc=1
    fi
    if [ -n "$made_dir" ]; then
        rmdir "$M" 2>/dev/null || true
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

show() { printf '\n$ %s\n' "$*"; }

show "rnixfs mount $M"
"$rnixfs" mount "$M"
mounted=1

show "exec 3<>$M/proc/new; echo \"$question\" >&3; read pid <&3"
exec 3<>"$M/proc/new"
if ! printf '%s\n' "$question" >&3; then
    # The reason for a refused request is readable from the same handle.
    reason=$(timeout 5 head -n 1 <&3 || true)
    echo "demo.sh: spawn refused: ${reason:-no reason given}" >&2
    exit 1
fi
pid=
read -r -t 30 pid <&3 || true
exec 3>&-
case $pid in
    ''|*[!0-9]*) echo "demo.sh: expected a PID from proc/new, got '${pid}'" >&2; exit 1 ;;
esac
echo "pid=$pid"
P=$M/proc/$pid

show "cat $P/wait"
timeout "$limit" cat "$P/wait" || {
    echo "demo.sh: process $pid did not exit within ${limit}s" >&2
    exit 1
}

show "cat $P/result"
cat "$P/result"
echo

show "head $P/trace"
head "$P/trace"

if command -v jq >/dev/null 2>&1; then
    show "jq . $P/status"
    jq . "$P/status"
else
    show "cat $P/status"
    cat "$P/status"
    echo
fi

# The daemon's view: processes, providers, and the command sandbox in force.
show "rnixfs status $M"
"$rnixfs" status "$M"
