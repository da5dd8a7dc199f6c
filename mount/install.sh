#!/usr/bin/env bash
# Install the mount(8) helper so that `mount -t fuse.rnixfs none /mnt/x -o ...`
# and fstab lines of type fuse.rnixfs work.
#
#   bash mount/install.sh [RNIXFS_PATH] [DEST]
#
# RNIXFS_PATH  the rnixfs executable to bake into the helper
#              (default: this repo's .venv/bin/rnixfs)
# DEST         where to install (default: $DESTDIR/sbin/mount.fuse.rnixfs)
#
# mount(8) runs helpers with PATH and HOME removed, so the helper needs the
# absolute path of rnixfs; it is substituted for the @RNIXFS_BIN@ placeholder.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)

bin=${1:-$root/.venv/bin/rnixfs}
dest=${2:-${DESTDIR:-}/sbin/mount.fuse.rnixfs}

case $bin in
    /*) ;;
    *) bin=$(pwd)/$bin ;;
esac
case $bin in
    *"'"*|*$'\n'*) echo "install.sh: unsupported character in path: $bin" >&2; exit 1 ;;
esac
if [ ! -x "$bin" ]; then
    echo "install.sh: $bin is not an executable (run scripts/setup.sh first)" >&2
    exit 1
fi

# Escape sed's replacement specials (\, &, and the | delimiter).
esc=$(printf '%s' "$bin" | sed 's/[\\&|]/\\&/g')
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
sed "s|@RNIXFS_BIN@|$esc|" "$here/mount.fuse.rnixfs" >"$tmp"
grep -qF "RNIXFS_INSTALLED_BIN='$bin'" "$tmp" || {
    echo "install.sh: substitution failed" >&2
    exit 1
}
mkdir -p "$(dirname "$dest")"
install -m 0755 "$tmp" "$dest"
echo "installed $dest (rnixfs: $bin)"
