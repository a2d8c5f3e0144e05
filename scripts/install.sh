#!/usr/bin/env bash
# Installs the uext4 binary and its mount helpers, so that tools that start fuse2fs-like
# programs find it:
#   $BINDIR/uext4                  (default /usr/local/bin) the binary
#   $SBINDIR/mount.fuse.uext4      (default /sbin) mount(8)'s helper for -t fuse.uext4 and fstab
#   $SBINDIR/mount.uext4           the same, for -t uext4
# Each helper is a symbolic link to the binary, which reads mount(8)'s and mount.fuse3's
# argument forms when called by those names (and fuse2fs's when called `fuse2fs`).
# Builds the release binary first if it is missing. Run as root for the default directories.
set -euo pipefail
cd "$(dirname "$0")/.."
BINDIR=${BINDIR:-/usr/local/bin}
SBINDIR=${SBINDIR:-/sbin}
bin=${CARGO_TARGET_DIR:-target}/release/uext4
[ -x "$bin" ] || cargo build --release -p uext4-cli
install -d "$BINDIR" "$SBINDIR"
install -m 0755 "$bin" "$BINDIR/uext4.new"
mv -f "$BINDIR/uext4.new" "$BINDIR/uext4"
ln -sf "$BINDIR/uext4" "$SBINDIR/mount.fuse.uext4"
ln -sf "$BINDIR/uext4" "$SBINDIR/mount.uext4"
echo "installed $BINDIR/uext4, $SBINDIR/mount.fuse.uext4, $SBINDIR/mount.uext4"
