#!/usr/bin/env bash
# Installs the uext4 binary and its mount helpers, so that tools that start fuse2fs-like
# programs find it:
#   $BINDIR/uext4                  (default /usr/local/bin) the binary
#   $BINDIR/uext4-bench            the benchmark harness `uext4 bench` runs
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
[ -x "$bin" ] && [ -x "$bin-bench" ] || cargo build --release -p uext4-cli -p uext4-bench
install -d "$BINDIR" "$SBINDIR"
for b in uext4 uext4-bench; do
  install -m 0755 "${bin%/uext4}/$b" "$BINDIR/$b.new"
  mv -f "$BINDIR/$b.new" "$BINDIR/$b"
done
ln -sf "$BINDIR/uext4" "$SBINDIR/mount.fuse.uext4"
ln -sf "$BINDIR/uext4" "$SBINDIR/mount.uext4"
echo "installed $BINDIR/uext4, $BINDIR/uext4-bench, $SBINDIR/mount.fuse.uext4, $SBINDIR/mount.uext4"
